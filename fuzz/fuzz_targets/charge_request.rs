#![no_main]
// See chargeguard::fuzzing::charge_request for what is parsed and which invariants are checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| chargeguard::fuzzing::charge_request(data));

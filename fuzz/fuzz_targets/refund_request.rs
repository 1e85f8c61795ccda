#![no_main]
// See chargeguard::fuzzing::refund_request for what is parsed and which invariants are checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| chargeguard::fuzzing::refund_request(data));

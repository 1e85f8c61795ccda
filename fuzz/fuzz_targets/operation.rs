#![no_main]
// See chargeguard::fuzzing::operation for what is parsed and which invariants are checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| chargeguard::fuzzing::operation(data));

#![no_main]
// See chargeguard::fuzzing::webhook for what is parsed and which invariants are checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| chargeguard::fuzzing::webhook(data));

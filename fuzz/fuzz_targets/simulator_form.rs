#![no_main]
// See chargeguard::fuzzing::simulator_form for what is parsed and which invariants are checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| chargeguard::fuzzing::simulator_form(data));

#![no_main]
// See sealnode::fuzzing::control for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sealnode::fuzzing::control(data));

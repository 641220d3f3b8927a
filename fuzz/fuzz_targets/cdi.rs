#![no_main]
// See sealnode::fuzzing::cdi for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sealnode::fuzzing::cdi(data));

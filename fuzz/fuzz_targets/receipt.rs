#![no_main]
// See sealnode::fuzzing::receipt for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sealnode::fuzzing::receipt(data));

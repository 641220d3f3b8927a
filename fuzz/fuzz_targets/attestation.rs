#![no_main]
// See sealnode::fuzzing::attestation for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sealnode::fuzzing::attestation(data));

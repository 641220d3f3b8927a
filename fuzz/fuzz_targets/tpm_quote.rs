#![no_main]
// See sealnode::fuzzing::tpm_quote for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sealnode::fuzzing::tpm_quote(data));

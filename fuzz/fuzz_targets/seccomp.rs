#![no_main]
// See sealnode::fuzzing::seccomp for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sealnode::fuzzing::seccomp(data));

#![no_main]
// See sealnode::fuzzing::landlock_rules for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sealnode::fuzzing::landlock_rules(data));

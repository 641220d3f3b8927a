#![no_main]
// See sealnode::fuzzing::control_reply for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sealnode::fuzzing::control_reply(data));

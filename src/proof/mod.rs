//! What proves the seal: the escape battery every start runs in each role's plan ([`canary`],
//! with [`probe`], its attempts' helpers), what runs, copied, sealed and hashed off the loop
//! ([`measure`], [`digests`]), the receipt of a start ([`receipt`]), signed statements and
//! their verification ([`attest`]) bound to a TPM ([`tpm`]), and what is sealed, in words
//! ([`sealed_text`]).

pub mod attest;
pub mod canary;
pub mod digests;
pub mod measure;
pub mod probe;
pub mod receipt;
pub mod sealed_text;
pub mod tpm;

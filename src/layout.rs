//! Where things are: the paths a role sees inside its sandbox (fixed, so policies can name
//! them), the system paths every role gets, the names of sealnode's own files in its state and
//! runtime dirs, and the host tools sealnode runs. Data only: the config checks against it,
//! the sandbox lays it out, the proof and supervisor write there.

use std::path::{Path, PathBuf};

/// Where role directories appear inside the sandbox. Fixed, so policies can name them.
pub const INSIDE_MODELS: &str = "/models";
pub const INSIDE_SCRATCH: &str = "/scratch";
pub const INSIDE_CREDENTIAL: &str = "/run/sealnode/credential";
/// The node's read-only view of the latest signed statement (docs/attestation.md): a dir of the
/// runtime dir (`attest/`), bound read-only, in which `run` replaces the file at every start of
/// either role ([`STATEMENT_FILE`]), so the node always reads the current generation's.
pub const INSIDE_ATTESTATION_DIR: &str = "/run/sealnode/attest";
pub const RUNTIME_ATTEST_DIR: &str = "attest";
pub const STATEMENT_FILE: &str = "statement.json";
/// The attestation key pair's dir and files in the state dir (never in a role's view).
pub const ATTEST_KEY_DIR: &str = "attest";
pub const ATTEST_KEY_FILE: &str = "ed25519.key";

/// Where the attestation signing key of a state dir lives.
pub fn attest_key_path(state_dir: &Path) -> PathBuf {
    state_dir.join(ATTEST_KEY_DIR).join(ATTEST_KEY_FILE)
}

/// Read-only system paths every role sees (when they exist on the host). Symlinks (e.g.
/// Debian's /lib -> usr/lib) are recreated as symlinks rather than bound.
pub const SYSTEM_RO: &[&str] = &[
    "/usr",                             // programs, libraries, Python's and the CA store's real files
    "/bin",                             // usually a symlink into /usr
    "/sbin",                            // usually a symlink into /usr
    "/lib",                             // dynamic loader and libc (symlink on merged-/usr systems)
    "/lib64",                           // x86_64 loader path
    "/etc/ld.so.cache",                 // library lookup without scanning
    "/etc/localtime",                   // time zone (llama-server, Python)
    "/etc/ssl",                         // CA bundle and OpenSSL config for TLS to the gateway
    "/etc/ca-certificates",             // targets of /etc/ssl/certs links on Debian
    "/etc/alternatives",                // targets of /usr/bin/* alternatives links
    "/etc/protocols",                   // getprotobyname (Python's socket module)
    "/etc/services",                    // getservbyname
    "/sys/devices/system/cpu/possible", // CPU count (llama.cpp, Python's os.cpu_count)
    "/sys/devices/system/cpu/online",   // CPU count
];

/// Paths inside a role that sealnode lays out itself: no extra bind may land on or under
/// them (`/` only exactly).
pub const RESERVED_INSIDE: &[&str] = &[
    "/",
    "/proc",
    "/dev",
    "/tmp",
    "/etc",
    INSIDE_SCRATCH,
    INSIDE_MODELS,
    "/run",
    // The setup's stages in the root tmpfs (sandbox::mounts): a bind's, the program's copy's.
    "/.sealnode-bind",
    "/.sealnode-program",
];

/// The tpm2-tools, by absolute path (Debian's package).
pub const TPM_TOOLS: &str = "/usr/bin";
/// The tools a statement needs; `attest tpm-init` needs [`TPM_INIT_TOOLS`] too.
pub const TPM_QUOTE_TOOLS: &[&str] = &["tpm2_pcrreset", "tpm2_pcrextend", "tpm2_quote", "tpm2_readpublic"];
pub const TPM_INIT_TOOLS: &[&str] = &["tpm2_createek", "tpm2_createak", "tpm2_evictcontrol", "tpm2_flushcontext"];

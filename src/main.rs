//! The command line: clap's definition of every subcommand, and the dispatch to `cli/`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use sealnode::config::{Role, DEFAULT_CONFIG};

mod cli;

/// Hardened launcher for sealed LLM-inference nodes.
#[derive(Parser, Debug)]
#[command(name = "sealnode", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the sealed node: the cell, the engine, then the node once the engine is ready;
    /// supervise both until SIGTERM/SIGINT (exit 0) or a failure (non-zero).
    ///
    /// Every start (first, crash restart, SIGHUP, recycle) passes the preflight canary and
    /// writes a new receipt first. SIGHUP reloads the config and policies (kept unchanged if
    /// invalid) and restarts only what the change needs: nothing (limits, timeouts), the node
    /// alone (the engine's inputs unchanged), or both roles (the cell's network namespaces
    /// stay; docs/operator-guide.md). Notifies systemd
    /// (READY=1 once the engine is ready and the node started, RELOADING=1, STATUS, WATCHDOG,
    /// STOPPING). Exit status: 0 stopped by a signal, 1 a role exited without restart, 3 the
    /// preflight found an escape, 4 the engine was not ready in time, 5 the restart limit was
    /// reached, 6 the preflight could not run, 125 a config, policy or setup error.
    Run {
        /// Config file.
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Check everything `run` checks before it starts anything, and start nothing (a dry run,
    /// like `nginx -t`): the config, the ownership of every file and dir it names, the
    /// policies, each role's sandbox plan (binds, program, sha256 pin, user), the dirs, the
    /// cgroup limits, the attestation key and TPM, and the kernel features.
    ///
    /// The config's own checks list up to 20 problems at once; once it loads, every other
    /// check runs, so one pass lists every problem. Exit status 0 when `run` would start, 125
    /// when it would refuse.
    Check {
        /// Config file.
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Machine-readable output: {"config", "ok", "checks": [{name, level, value, meaning}]}.
        #[arg(long)]
        json: bool,
    },
    /// Write a complete config for an engine, a model, the node's venv and a gateway, with the
    /// users, dirs and ownership it needs, then run `check` on it.
    ///
    /// Flags give every answer (automation); on a terminal, init asks for the engine, model,
    /// venv and gateway URL a flag left out. It derives the engine's kind, port and command
    /// (the port in its own flag or OLLAMA_HOST too), the model dir (the model file's own dir),
    /// the node's command from the venv, the egress entry from the gateway URL, and the binds:
    /// the engine's dir and RUNPATH dirs, the venv and its interpreter's prefix, or a copy of
    /// the prefix bound at the original path when the role users cannot reach it. As root it
    /// creates the role users, the state, runtime and scratch dirs with their owners and modes,
    /// installs the credential (0400, the node's user) and writes the config root-owned 0644;
    /// as another user (rootless) everything belongs to that user. An existing config is kept
    /// unless --force; --dry-run prints the config and the actions only. Exit status 0 when
    /// `check` passes, 125 when it would refuse (each FAIL says what to fix), 2 for a missing
    /// answer off a terminal.
    Init(Box<cli::init::Args>),
    /// Run a command inside one role's complete sandbox instead of the role's own program.
    ///
    /// stdin/stdout/stderr pass through; the exit code passes through (128+N for signal N);
    /// 125 if the sandbox could not be set up (the failing step and errno are printed).
    /// SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed on to the command; the
    /// sandbox and all in it are killed (exit 137) `cell.stop_timeout_s` after the first
    /// SIGTERM, SIGINT, SIGHUP or SIGQUIT, or at a second one. A signal ignored when `exec`
    /// started (nohup) stays ignored.
    Exec {
        /// Config file.
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Which role's sandbox.
        #[arg(long, value_enum)]
        role: Role,
        /// Command and arguments (argv[0] absolute, or a name found in the sandbox's PATH).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Prove the isolation: run the battery of escape attempts inside each role's exact
    /// sandbox (in a cell like `run` builds) and report which layer refused each one.
    ///
    /// Exit status 0 when every attempt was refused, 1 when any succeeded.
    Canary {
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Only this role (default: both).
        #[arg(long, value_enum)]
        role: Option<Role>,
        /// The versioned JSON report (docs/canary.md) instead of the table.
        #[arg(long)]
        json: bool,
        /// Re-run the battery with one layer at a time and show which attempts each layer stops
        /// on its own; exit 1 if an attempt not listed as an exception has fewer than two.
        #[arg(long)]
        matrix: bool,
        /// Also write the battery as JUnit XML to this file (one test case per attempt and role;
        /// `-` for stdout instead of the table).
        #[arg(long, value_name = "FILE", conflicts_with = "matrix")]
        junit: Option<PathBuf>,
        /// Also write the battery as TAP version 13 to this file (`-` for stdout instead of the table).
        #[arg(long, value_name = "FILE", conflicts_with = "matrix")]
        tap: Option<PathBuf>,
    },
    /// Talk to a running `sealnode run` over its control socket.
    ///
    /// `status` shows the cell, each role and each forwarding route as a table (`--json`: the
    /// control protocol's answer, docs/control.md); `metrics` prints them as Prometheus text
    /// (or writes a node_exporter textfile); `recycle` drains, wipes and restarts both roles.
    Ctl {
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// The control socket itself (RUNTIME_DIR/control.sock), used instead of the config's:
        /// reaches a cell whatever its config file says now.
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        #[arg(value_enum)]
        command: CtlCommand,
        /// status, recycle: the control protocol's JSON answer instead of words.
        #[arg(long)]
        json: bool,
        /// metrics: write the exposition to this file atomically (node_exporter's textfile
        /// collector reads `*.prom`) instead of stdout.
        #[arg(long, value_name = "FILE")]
        textfile: Option<PathBuf>,
    },
    /// Signed attestations of the seal (docs/attestation.md): `attest init` makes the key,
    /// `attest pubkey` prints it, `attest --nonce HEX` asks the running supervisor for a
    /// statement over the current generation and that nonce.
    ///
    /// The statement is an in-toto Statement v1 in a DSSE envelope, signed with an ed25519 key
    /// kept owner-only in the state dir (never in a role's view, never sent over the control
    /// socket). Its subjects are the sha256 digests of what runs (sealnode, the config, each
    /// role's program and policies, the CDI spec, the model files); its predicate says how
    /// (generation, nonce, kernel, Landlock ABI, layers, preflight, limits, restarts, TPM).
    #[command(args_conflicts_with_subcommands = true)]
    Attest {
        #[command(subcommand)]
        action: Option<AttestAction>,
        /// The verifier's nonce, in hex (8 to 64 bytes): the statement answers it.
        #[arg(long)]
        nonce: Option<String>,
        /// Config file.
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Verify a statement from `sealnode attest` offline: the signature with the given public
    /// key, the nonce, then each `--expect` and `--min-generation`; says what was verified.
    ///
    /// Exit status 0 verified, 10 no signature by that key verifies (a changed byte, another
    /// key), 11 another nonce or none (a replay), 12 a digest or the generation is not what was
    /// expected, 13 not a sealnode attestation, 14 (with --tpm-ak) the TPM quote is missing or
    /// does not bind the statement, 125 a file could not be read.
    VerifyAttestation {
        /// The envelope (the JSON `sealnode attest --nonce` printed).
        file: PathBuf,
        /// The public key: the PEM `sealnode attest pubkey` prints (or the raw key in hex).
        #[arg(long)]
        pubkey: PathBuf,
        /// The nonce the verifier sent, in hex.
        #[arg(long, required_unless_present = "no_nonce", conflicts_with = "no_nonce")]
        nonce: Option<String>,
        /// Accept only the statement written at start, which answers no nonce (the one the node
        /// reads at /run/sealnode/attest/statement.json): not fresh, so use --min-generation.
        #[arg(long)]
        no_nonce: bool,
        /// A subject and the digest it must have, e.g. engine.program=SHA256 or
        /// model:model.gguf=SHA256 (repeatable).
        #[arg(long = "expect", value_name = "NAME=SHA256")]
        expect: Vec<String>,
        /// Refuse a statement of an older generation than this (the last one the verifier saw).
        #[arg(long)]
        min_generation: Option<u64>,
        /// The TPM attestation key the verifier enrolled (the PEM `sealnode attest tpm-pubkey`
        /// prints): the envelope's TPM quote must verify with it, over this statement and nonce.
        #[arg(long, value_name = "PEM")]
        tpm_ak: Option<PathBuf>,
    },
    /// Check a receipt against the current config, policies and binaries.
    ///
    /// Exit status 0 when everything matches, 1 with the mismatches otherwise.
    VerifyReceipt {
        /// The receipt (default: receipt.json in the config's state dir).
        file: Option<PathBuf>,
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Write a role's compiled seccomp program as raw BPF to stdout (for inspection and for the
    /// benchmarks: `bwrap --seccomp FD` takes this format).
    SeccompBpf {
        /// The seccompiler JSON policy file.
        policy: PathBuf,
        /// The filter's name in the file (the role).
        #[arg(long, value_enum)]
        role: Role,
        /// seccompiler's linear chain instead of sealnode's binary search (comparison only).
        #[arg(long)]
        seccompiler: bool,
    },
    /// Report what this kernel offers sealnode and what each fact means.
    Doctor {
        /// Config file: its policies' minimum Landlock ABI and its limits are checked, and a call
        /// only some configs make (clone3 for cgroup leaves, a seccomp listener for
        /// log_refused_syscalls) fails when this one makes it, rather than warns.
        #[arg(long, env = "SEALNODE_CONFIG")]
        config: Option<PathBuf>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Write the man pages (sealnode.1 and one sealnode-<subcommand>.1 per subcommand) to a directory.
    Man {
        /// Output directory (created if missing).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
    /// Print a shell completion script to stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Run sealnode's probe inside a role's sandbox and print what it sees (JSON).
    #[command(hide = true)]
    Probe {
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        #[arg(long, value_enum)]
        role: Role,
        /// Extra probe attempts: --read P, --write P, --list P, --open P, --exec-copy P, --connect A, --fetch A,
        /// --bind A, --connect-abstract NAME, --kill PID.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Internal: the canary's attempts, inside the sandbox.
    #[command(name = "__canary-inside", hide = true)]
    CanaryInside { ctx: String, ids: Vec<String> },
    /// Internal: the probe itself, inside the sandbox.
    #[command(name = "__probe-inside", hide = true)]
    ProbeInside {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
enum AttestAction {
    /// Make the signing key (ed25519), owner-only in the state dir; prints the public key.
    /// An existing key is kept unless --force, which retires it (ed25519.key.retired-TIME).
    Init {
        /// Replace an existing key (rotation: docs/attestation.md).
        #[arg(long)]
        force: bool,
        /// Config file.
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Print the subjects a statement of this config carries, as NAME=SHA256 lines (what a
    /// gateway passes to verify-attestation --expect); the model files are hashed through the
    /// state dir's cache, as `run` does.
    Subjects {
        /// Config file.
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Make the TPM's attestation key (`cell.tpm`): an ECC endorsement key, an ECDSA P-256
    /// attestation key under it persisted at cell.tpm.ak_handle; stores both public keys in
    /// the state dir and prints the attestation key. Needs Debian's tpm2-tools.
    TpmInit {
        /// Replace a key already at the handle (verifiers must enrol the new one).
        #[arg(long)]
        force: bool,
        /// Config file.
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Print the TPM attestation key (SPKI PEM, alone on stdout) and, on stderr, its id (sha256
    /// of its DER), as `attest tpm-init` stored it.
    TpmPubkey {
        /// Config file.
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Print the public key (SPKI PEM, alone on stdout: `> node1.pem` is the file
    /// verify-attestation --pubkey takes) and, on stderr, its fingerprint (sha256 of the raw key).
    Pubkey {
        /// Config file.
        #[arg(long, env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CtlCommand {
    /// Roles, pids, uptime, restarts, egress counters, last receipt.
    Status,
    /// The same facts as Prometheus text exposition (format 0.0.4).
    Metrics,
    /// Drain, stop both roles, wipe scratch, re-provision, start, canaries, new receipt.
    Recycle,
    /// Exit 0 when the cell serves (both roles run, the engine answered its readiness check,
    /// no stop under way), else 1 saying why: a readiness probe.
    Ready,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A command that prints (check, doctor, ctl, man, ...) into a reader that went away ends as
    // any Unix tool does, killed by SIGPIPE, not with a panic. `run` keeps it ignored (its
    // output never blocks or fails it: logsink), and so does `exec` (its workload's pipe).
    if !matches!(cli.command, Command::Run { .. } | Command::Exec { .. } | Command::Probe { .. }) {
        // SAFETY: restoring the default disposition of one signal, before any thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let logging = match cli.command {
        Command::ProbeInside { .. }
        | Command::CanaryInside { .. }
        | Command::Man { .. }
        | Command::Completions { .. } => Ok(()),
        Command::Run { .. } => cli::init_logging("info"),
        _ => cli::init_logging("warn"),
    };
    if let Err(f) = logging {
        return cli::exit(Err(f));
    }
    cli::exit(match cli.command {
        Command::Run { config } => cli::run::run(&config),
        Command::Check { config, json } => cli::check::check(&config, json),
        Command::Init(args) => cli::init::init(*args),
        Command::Exec { config, role, command } => cli::exec::exec(&config, role, command),
        Command::Probe { config, role, args } => cli::exec::probe(&config, role, args),
        Command::ProbeInside { args } => Ok(sealnode::proof::probe::run_inside(&args)),
        Command::CanaryInside { ctx, ids } => Ok(sealnode::proof::canary::inside::main(&ctx, &ids)),
        Command::Ctl { config, socket, command, json, textfile } => cli::ctl::ctl(
            match &socket {
                Some(s) => cli::ctl::Target::Socket(s),
                None => cli::ctl::Target::Config(&config),
            },
            match command {
                CtlCommand::Status => cli::ctl::Show::Status { json },
                CtlCommand::Metrics => cli::ctl::Show::Metrics { textfile },
                CtlCommand::Recycle => cli::ctl::Show::Recycle { json },
                CtlCommand::Ready => cli::ctl::Show::Ready,
            },
        ),
        Command::VerifyReceipt { file, config } => cli::receipt::verify(file, &config),
        Command::Attest { action, nonce, config } => match (action, nonce) {
            (Some(AttestAction::Init { force, config }), _) => cli::attest::init(&config, force),
            (Some(AttestAction::Pubkey { config }), _) => cli::attest::pubkey(&config),
            (Some(AttestAction::Subjects { config }), _) => cli::attest::subjects(&config),
            (Some(AttestAction::TpmInit { force, config }), _) => cli::attest::tpm_init(&config, force),
            (Some(AttestAction::TpmPubkey { config }), _) => cli::attest::tpm_pubkey(&config),
            (None, Some(n)) => cli::attest::request(&config, &n),
            (None, None) => Err(cli::Failure::usage("attest: give --nonce HEX, or `attest init` / `attest pubkey`")),
        },
        Command::VerifyAttestation { file, pubkey, nonce, no_nonce: _, expect, min_generation, tpm_ak } => {
            cli::attest::verify(&file, &pubkey, nonce.as_deref(), &expect, min_generation, tpm_ak.as_deref())
        }
        Command::SeccompBpf { policy, role, seccompiler } => cli::seccomp_bpf::seccomp_bpf(&policy, role, seccompiler),
        Command::Canary { config, role, json, matrix, junit, tap } => {
            cli::canary::canary(cli::canary::Args { config, role, json, matrix, junit, tap })
        }
        Command::Doctor { config, json } => cli::doctor::doctor(config, json),
        Command::Man { dir } => cli::docs::man(<Cli as clap::CommandFactory>::command(), &dir),
        Command::Completions { shell } => cli::docs::completions(<Cli as clap::CommandFactory>::command(), shell),
    })
}

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use sealnode::config::{Config, Invoker, Role, DEFAULT_CONFIG};
use sealnode::sandbox::{self, Plan, Program, SETUP_FAILED};

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
    /// invalid) and restarts both roles (the cell's network namespace stays). Notifies systemd
    /// (READY=1 once the engine is ready and the node started, RELOADING=1, STATUS, WATCHDOG,
    /// STOPPING). Exit status: 0 stopped by a signal, 1 a role exited without restart, 3 the
    /// preflight found an escape, 4 the engine was not ready in time, 5 the restart limit was
    /// reached, 6 the preflight could not run, 125 a config, policy or setup error.
    Run {
        /// Config file.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Run a command inside one role's complete sandbox instead of the role's own program.
    ///
    /// stdin/stdout/stderr pass through; the exit code passes through (128+N for signal N);
    /// 125 if the sandbox could not be set up (the failing step and errno are printed).
    Exec {
        /// Config file.
        #[arg(long, default_value = DEFAULT_CONFIG)]
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
        #[arg(long, default_value = DEFAULT_CONFIG)]
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
    Ctl {
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        #[arg(value_enum)]
        command: CtlCommand,
    },
    /// Check a receipt against the current config, policies and binaries.
    ///
    /// Exit status 0 when everything matches, 1 with the mismatches otherwise.
    VerifyReceipt {
        /// The receipt (default: receipt.json in the config's state dir).
        file: Option<PathBuf>,
        #[arg(long, default_value = DEFAULT_CONFIG)]
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
        /// Config file (its policies' minimum Landlock ABI is checked when given).
        #[arg(long)]
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
        #[arg(long, default_value = DEFAULT_CONFIG)]
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

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CtlCommand {
    /// Roles, pids, uptime, restarts, egress counters, last receipt.
    Status,
    /// Drain, stop both roles, wipe scratch, re-provision, start, canaries, new receipt.
    Recycle,
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SEALNODE_LOG").unwrap_or_else(|_| default.into());
    use std::io::IsTerminal;
    // journald (or any pipe) gets plain lines: one event per line, no colour codes.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// One roff page for the top-level command and one per visible subcommand (`sealnode-run.1`, ...).
fn write_man_pages(dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let top = <Cli as clap::CommandFactory>::command();
    let mut pages = vec![top.clone()];
    for sub in top.get_subcommands().filter(|c| !c.is_hide_set()) {
        // Page `sealnode-canary(1)`, synopsis `sealnode canary ...`, as git names its pages.
        let bin = format!("sealnode {}", sub.get_name());
        pages.push(sub.clone().name(format!("sealnode-{}", sub.get_name())).bin_name(bin));
    }
    for page in pages {
        let path = dir.join(format!("{}.1", page.get_name()));
        let mut out = Vec::new();
        let man = clap_mangen::Man::new(page).source(concat!("sealnode ", env!("CARGO_PKG_VERSION")));
        man.render(&mut out).map_err(|e| format!("cannot render {}: {e}", path.display()))?;
        sealnode::receipt::write_atomic(&path, &out, 0o644).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Write the canary battery's JUnit and TAP reports where asked (`-` is stdout).
fn write_ci_reports(
    r: &sealnode::canary::Report,
    junit: Option<&std::path::Path>,
    tap: Option<&std::path::Path>,
) -> Result<(), String> {
    use sealnode::canary::ci_report;
    let mut outputs = Vec::new();
    if let Some(p) = junit {
        let xml = ci_report::junit(r).map_err(|e| format!("canary --junit: cannot render the report: {e}"))?;
        outputs.push((p, xml));
    }
    if let Some(p) = tap {
        outputs.push((p, ci_report::tap(r)));
    }
    for (path, text) in outputs {
        if path == std::path::Path::new("-") {
            print!("{text}");
        } else {
            // New file then rename: never follows a planted symlink, never leaves half a report.
            sealnode::receipt::write_atomic(path, text.as_bytes(), 0o644).map_err(|e| format!("canary: {e}"))?;
        }
    }
    Ok(())
}

/// Build the plan and run it to completion; any failure before the workload runs is 125.
fn run_sandboxed(config: &std::path::Path, role: Role, argv: Vec<String>, program: Option<Program>) -> ExitCode {
    let inv = Invoker::current();
    let result = Config::load(config, &inv)
        .and_then(|cfg| Plan::build(&cfg, role, &inv, Some(argv), program))
        .and_then(|plan| {
            let sb = sandbox::spawn(&plan)?;
            tracing::info!(role = %role, pid = sb.pid.as_raw(), "sandbox started");
            let code = sandbox::run_to_exit(sb);
            drop(plan);
            Ok(code)
        });
    match result {
        Ok(code) => exit(code),
        Err(e) => {
            eprintln!("sealnode: {e}");
            exit(SETUP_FAILED)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::ProbeInside { .. }
        | Command::CanaryInside { .. }
        | Command::Man { .. }
        | Command::Completions { .. } => {}
        Command::Run { .. } => init_logging("info"),
        _ => init_logging("warn"),
    }
    match cli.command {
        Command::Run { config } => {
            // Signals wait (blocked) from the first instruction: the supervisor takes them from
            // its signalfd, so one sent while the config loads or the cell is made is not lost
            // and does not kill sealnode half-way (found by review).
            let _ = nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_BLOCK,
                Some(&sandbox::spawn::launcher_sigset()),
                None,
            );
            let inv = Invoker::current();
            let sup = Config::load(&config, &inv).and_then(|cfg| sealnode::supervisor::Supervisor::new(cfg, inv));
            match sup {
                Ok(sup) => exit(sup.run()),
                Err(e) => {
                    eprintln!("sealnode: {e}");
                    exit(SETUP_FAILED)
                }
            }
        }
        Command::Exec { config, role, command } => run_sandboxed(&config, role, command, None),
        Command::Probe { config, role, args } => {
            let fd = match sandbox::plan::sealed_self() {
                Ok(fd) => fd,
                Err(e) => {
                    eprintln!("sealnode: {e}");
                    return exit(SETUP_FAILED);
                }
            };
            let mut argv = vec!["sealnode-probe".to_string(), "__probe-inside".to_string()];
            argv.extend(args);
            run_sandboxed(&config, role, argv, Some(Program::SealedSelf(fd)))
        }
        Command::ProbeInside { args } => exit(sealnode::probe::run_inside(&args)),
        Command::Ctl { config, command } => {
            let cfg = match Config::read_for_client(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("sealnode: {e}");
                    return exit(1);
                }
            };
            let cmd = match command {
                CtlCommand::Status => "status",
                CtlCommand::Recycle => "recycle",
            };
            match sealnode::control::client(&sealnode::control::socket_path(&cfg), cmd) {
                Ok(v) => {
                    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                    exit(if v["ok"] == true { 0 } else { 1 })
                }
                Err(e) => {
                    eprintln!("sealnode: {e}");
                    exit(1)
                }
            }
        }
        Command::VerifyReceipt { file, config } => {
            let inv = Invoker::current();
            let result = Config::load(&config, &inv).and_then(|cfg| {
                let path = file.unwrap_or_else(|| sealnode::receipt::path(&cfg));
                let r = sealnode::receipt::load(&path)?;
                Ok((path, r.generation, sealnode::receipt::verify(&r, &cfg)?))
            });
            match result {
                Ok((path, generation, bad)) if bad.is_empty() => {
                    println!(
                        "{}: generation {generation} matches the current config, policies and binaries",
                        path.display()
                    );
                    exit(0)
                }
                Ok((path, generation, bad)) => {
                    println!("{}: generation {generation} does NOT match:", path.display());
                    for b in bad {
                        println!("  {b}");
                    }
                    exit(1)
                }
                Err(e) => {
                    eprintln!("sealnode: {e}");
                    exit(1)
                }
            }
        }
        Command::SeccompBpf { policy, role, seccompiler } => {
            use std::io::Write;
            let arch = sealnode::policy::seccomp::native_arch();
            let prog = std::fs::read_to_string(&policy)
                .map_err(|e| sealnode::Error::policy(&policy, format!("cannot read: {e}")))
                .and_then(|t| {
                    if seccompiler {
                        sealnode::policy::seccomp::compile_with_seccompiler(&t, &policy, role.name(), arch)
                    } else {
                        sealnode::policy::seccomp::compile_text(&t, &policy, role.name(), arch)
                    }
                });
            match prog {
                Ok(p) => {
                    let mut out = Vec::with_capacity(p.len() * 8);
                    for i in &p {
                        out.extend_from_slice(&i.code.to_ne_bytes());
                        out.extend_from_slice(&[i.jt, i.jf]);
                        out.extend_from_slice(&i.k.to_ne_bytes());
                    }
                    exit(if std::io::stdout().write_all(&out).is_ok() { 0 } else { 1 })
                }
                Err(e) => {
                    eprintln!("sealnode: {e}");
                    exit(1)
                }
            }
        }
        Command::CanaryInside { ctx, ids } => exit(sealnode::canary::inside::main(&ctx, &ids)),
        Command::Canary { config, role, json, matrix, junit, tap } => {
            let dash = |p: &Option<PathBuf>| p.as_deref() == Some(std::path::Path::new("-"));
            if usize::from(json) + usize::from(dash(&junit)) + usize::from(dash(&tap)) > 1 {
                eprintln!("sealnode: canary: only one of --json, --junit - and --tap - can use stdout");
                return ExitCode::from(2);
            }
            let inv = Invoker::current();
            let roles: Vec<Role> = role.map(|r| vec![r]).unwrap_or_else(|| Role::ALL.to_vec());
            let cfg = match Config::load(&config, &inv) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("sealnode: {e}");
                    return exit(SETUP_FAILED);
                }
            };
            if matrix {
                match sealnode::canary::matrix(&cfg, &inv, &roles) {
                    Ok(m) => {
                        if json {
                            println!("{}", serde_json::to_string_pretty(&m).unwrap_or_default());
                        } else {
                            print!("{}", sealnode::canary::render_matrix(&m));
                        }
                        exit(if m.violations.is_empty() { 0 } else { 1 })
                    }
                    Err(e) => {
                        eprintln!("sealnode: {e}");
                        exit(SETUP_FAILED)
                    }
                }
            } else {
                match sealnode::canary::battery(&cfg, &inv, &roles, None) {
                    Ok(r) => {
                        if let Err(e) = write_ci_reports(&r, junit.as_deref(), tap.as_deref()) {
                            eprintln!("sealnode: {e}");
                            return exit(SETUP_FAILED);
                        }
                        if json {
                            println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
                        } else if ![&junit, &tap].iter().any(|p| p.as_deref() == Some(std::path::Path::new("-"))) {
                            print!("{}", sealnode::canary::render(&r));
                        }
                        exit(if r.passed { 0 } else { 1 })
                    }
                    Err(e) => {
                        eprintln!("sealnode: {e}");
                        exit(SETUP_FAILED)
                    }
                }
            }
        }
        Command::Man { dir } => match write_man_pages(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sealnode: man: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "sealnode", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Doctor { config, json } => {
            let inv = Invoker::current();
            let mut min_abi = 6;
            if let Some(c) = config {
                match Config::load(&c, &inv) {
                    Ok(cfg) => {
                        for r in Role::ALL {
                            let rules = cfg.policy_files(r).and_then(|(_, ll)| {
                                sealnode::policy::landlock::Rules::from_loaded(&ll.bytes, &cfg.role(r).landlock)
                            });
                            match rules {
                                Ok(rules) => min_abi = min_abi.max(rules.min_abi),
                                Err(e) => {
                                    eprintln!("sealnode: {e}");
                                    return exit(1);
                                }
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("sealnode: {e}");
                        return exit(1);
                    }
                }
            }
            exit(sealnode::doctor::report(&sealnode::doctor::checks(min_abi), json))
        }
    }
}

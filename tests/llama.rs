//! Real workloads end to end: llama.cpp's llama-server with a real model as the engine, the
//! real frutebox-node 0.1.0 as the node, a test gateway on the host reached only through
//! declared egress. Prepared by scripts/build-llama-server and scripts/prepare-python
//! (.ci/run runs both).

mod common;

use std::io::BufRead;
use std::io::BufReader;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn real_llama_server_and_frutebox_node_sealed_end_to_end() {
    let Some(r) = real() else {
        return unavailable("llama", "SEALNODE_TEST_LLAMA_SERVER/_MODEL or the Python env are not prepared (scripts/build-llama-server, scripts/prepare-python)");
    };
    end_to_end(&r, None);
}

/// The second engine: llama-cpp-python's own OpenAI-compatible server (Python, FastAPI and
/// uvicorn) under the same engine policy, proving the policy also fits a Python engine.
#[test]
fn llama_cpp_python_server_as_the_engine_end_to_end() {
    let (Some(r), Some(pyengine)) =
        (real(), std::env::var("SEALNODE_TEST_PYENGINE").ok().filter(|p| std::path::Path::new(p).exists()))
    else {
        return unavailable("llama", "SEALNODE_TEST_PYENGINE (llama-cpp-python[server] venv) or the llama env are not prepared (scripts/build-llama-server)");
    };
    end_to_end(&r, Some(&pyengine));
}

fn end_to_end(r: &Real, pyengine: Option<&str>) {
    for (i, mode) in modes().into_iter().enumerate() {
        let mut f = Fixture::new(mode, if pyengine.is_some() { "llama-py" } else { "llama" });
        // The engine's view holds exactly the one model it should serve.
        let model = f.p("models/smollm2.gguf");
        std::fs::remove_file(f.p("models/model.gguf")).expect("rm");
        if std::fs::hard_link(&r.model, &model).is_err() {
            std::fs::copy(&r.model, &model).expect("copy model");
        }
        let bin_dir = std::path::Path::new(&r.server).parent().expect("dir").display().to_string();
        let gw_port =
            18900 + i as u16 + (std::process::id() % 40) as u16 * 2 + if pyengine.is_some() { 100 } else { 0 };
        if let Some(pe) = pyengine {
            // Its venv's interpreter is the same CPython the node uses, bound at its prefix.
            f.engine_cmd = format!("[\"{pe}/bin/python\", \"-I\", \"-m\", \"llama_cpp.server\", \"--model\", \"/models/smollm2.gguf\", \"--model_alias\", \"smollm2\", \"--host\", \"127.0.0.1\", \"--port\", \"18080\", \"--n_threads\", \"1\", \"--n_ctx\", \"2048\", \"--use_mlock\", \"false\", \"--interrupt_requests\", \"false\"]");
            f.engine_extra = format!(
                "ro_binds = [{{ src = \"{}\", dst = \"{}\" }}, {{ src = \"{pe}\" }}]\nready = {{ kind = \"http\", path = \"/v1/models\", timeout_s = 120 }}",
                r.pycopy, r.prefix
            );
        } else {
            f.engine_cmd = "[\"/opt/llama/llama-server\", \"-m\", \"/models/smollm2.gguf\", \"--host\", \"127.0.0.1\", \"--port\", \"18080\", \"-t\", \"1\", \"-c\", \"2048\"]".into();
            f.engine_extra = format!("ro_binds = [{{ src = \"{bin_dir}\", dst = \"/opt/llama\" }}]\nready = {{ kind = \"http\", path = \"/health\", timeout_s = 120 }}");
        }
        let py = format!("{}/bin/python", r.venv);
        f.node_cmd = format!(
            "[\"{py}\", \"-I\", \"-u\", \"-m\", \"frutebox.provider\", \"--id\", \"sealed-llama\", \"--gateway-url\", \"ws://gateway.test:{gw_port}/provider/ws\", \"--models\", \"smollm2\", \"--compute-type\", \"cpu\", \"--memory-gb\", \"2\", \"--cpu-cores\", \"1\"]"
        );
        f.node_extra = format!(
            "ro_binds = [{{ src = \"{}\", dst = \"{}\" }}, {{ src = \"{}\" }}]\negress = [{{ host = \"gateway.test\", port = {gw_port}, connect = \"127.0.0.1:{gw_port}\" }}]",
            r.pycopy, r.prefix, r.venv
        );
        f.write_config();
        let text = std::fs::read_to_string(&f.config).expect("read").replace(
            "env = { set = { FRUTEBOX_ENGINE = \"llamacpp\" }, pass = [\"SEALNODE_TEST_PASS\"] }",
            "env = { set = { FRUTEBOX_ENGINE = \"llamacpp\", FRUTEBOX_LLAMACPP_HOST = \"http://127.0.0.1:18080\", FRUTEBOX_NODE_STATE_FILE = \"/scratch/state\" } }",
        );
        std::fs::write(&f.config, text).expect("write");
        let gw_script = repo().join("examples/demo/standin-gateway.py");
        let mut gw = Command::new(&py)
            .args([
                "-u",
                &gw_script.display().to_string(),
                "--port",
                &gw_port.to_string(),
                "--model",
                "smollm2",
                "--timeout",
                "150",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("gateway");
        // The gateway's lines as they come, with the time each arrived.
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Instant, String)>::new()));
        let (l2, gw_stdout) = (lines.clone(), gw.stdout.take().expect("gateway stdout"));
        let reader = std::thread::spawn(move || {
            for l in BufReader::new(gw_stdout).lines().map_while(Result::ok) {
                l2.lock().expect("lock").push((Instant::now(), l));
            }
        });
        let seen = |lines: &std::sync::Mutex<Vec<(Instant, String)>>, what: &str| {
            lines.lock().expect("lock").iter().find(|(_, l)| l.contains(what)).map(|(t, _)| *t)
        };
        assert!(
            wait_until(Duration::from_secs(30), || seen(&lines, "gateway: listening").is_some()),
            "{mode:?}: gateway"
        );
        let mut run = f.start_run();
        // While the real workloads run: once the gateway has sent its first job to the sealed
        // node, a fresh battery (same cell layout) runs while the engine works on it.
        let cfg = f.config.display().to_string();
        let mut canary_cmd = f.command(&["canary", "--config", &cfg, "--json"]);
        let l3 = lines.clone();
        let canary = std::thread::spawn(move || {
            let sent = wait_until(Duration::from_secs(170), || seen(&l3, "gateway: -> ").is_some());
            let started = Instant::now();
            (sent, started, canary_cmd.output_within(COMMAND_LIMIT))
        });
        let (gw_status, _) = run.wait_for_gateway(&mut gw, Duration::from_secs(170), mode);
        let (sent, canary_started, canary) = canary.join().expect("canary thread");
        let (status, err) = run.stop();
        // The reader thread has the gateway's last lines once the pipe closed (it exited).
        assert!(wait_until(READ_LIMIT, || reader.is_finished()), "{mode:?}: gateway stdout still open");
        let gw_out: String = lines.lock().expect("lock").iter().map(|(_, l)| format!("{l}\n")).collect();
        assert!(sent, "{mode:?}: the gateway never sent a job: {gw_out}");
        let done = seen(&lines, "job round trip complete")
            .unwrap_or_else(|| panic!("{mode:?}: no round trip: {gw_out}\nsealnode: {err}"));
        assert!(canary_started < done, "{mode:?}: the canary started only after the jobs were done");
        assert!(gw_status.success(), "{mode:?}: gateway: {gw_out}\nsealnode: {err}");
        // The gateway prints the result with Python's repr: '...' or "..." when it holds a quote.
        let plain = gw_out.split("job-plain result: ").nth(1).unwrap_or("");
        assert!(
            (plain.starts_with('\'') || plain.starts_with('"'))
                && !plain.starts_with("''")
                && !plain.starts_with("\"\""),
            "{mode:?}: no non-empty result: {gw_out}"
        );
        assert!(gw_out.contains("job-stream result") && gw_out.contains("streamed as"), "{mode:?}: {gw_out}");
        assert_eq!(status.code(), Some(0), "{mode:?}: {err}");
        let c: serde_json::Value = serde_json::from_slice(&canary.stdout).expect("canary json");
        assert_eq!(c["passed"], true, "{mode:?}: canary while the real workloads ran: {c}");
        assert_eq!(canary.status.code(), Some(0), "{mode:?}: {}", String::from_utf8_lossy(&canary.stderr));
        // Egress: the node's only upstream is the gateway and nothing was refused (the node's
        // reconnects after the test gateway exited are the only failed connects).
        let totals = log_fields(&err, "egress totals");
        assert_eq!(totals.len(), 1, "{mode:?}: one upstream, one totals line: {err}");
        assert_eq!(totals[0]["upstream"], format!("gateway.test:{gw_port}"), "{mode:?}: {err}");
        assert_eq!(totals[0]["refused"], "0", "{mode:?}: {err}");
    }
}

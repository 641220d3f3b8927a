//! Role output: lines split, long lines cut once, floods dropped and counted.

use super::*;
use std::time::Duration;

fn capture() -> Capture {
    let (r, _w) = nix::unistd::pipe().expect("pipe");
    Capture::new(Role::Engine, 42, 7, false, r)
}

fn lines(c: &mut Capture, data: &[&[u8]], budget: &mut Budget) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let now = Instant::now();
    for d in data {
        c.feed(d, budget, now, &mut |_, l| out.push(l.to_vec()));
    }
    out
}

#[test]
fn lines_are_split_across_reads() {
    let mut b = budget(Instant::now());
    let mut c = capture();
    let got = lines(&mut c, &[b"one\ntw", b"o\n\nthree"], &mut b);
    assert_eq!(got, vec![b"one".to_vec(), b"two".to_vec(), b"".to_vec()]);
    // "three" waits for its newline (or EOF).
    assert_eq!(c.buf, b"three");
}

#[test]
fn a_long_line_is_cut_once_and_the_rest_dropped() {
    let mut b = budget(Instant::now());
    let mut c = capture();
    let big = vec![b'x'; MAX_LINE * 3 + 5];
    let got = lines(&mut c, &[&big, &big, b"\nnext\n"], &mut b);
    assert_eq!(got.len(), 2, "{:?}", got.iter().map(|l| l.len()).collect::<Vec<_>>());
    assert!(got[0].starts_with(&vec![b'x'; MAX_LINE]) && got[0].ends_with(b" [line cut at 16384 bytes]"));
    assert_eq!(got[0].len(), MAX_LINE + " [line cut at 16384 bytes]".len());
    assert_eq!(got[1], b"next");
    assert_eq!(c.cut, 1);
    assert!(c.buf.capacity() <= MAX_LINE * 2, "the line buffer stays bounded");
}

/// Found by review: the cut was made before escaping, and an escape is up to 10 bytes for
/// one of the role's: 16 KiB of control bytes made a 96 KiB line. Once escaped, a line is cut
/// again, between escapes; a line that needs no escape is shown as it was cut.
#[test]
fn an_escaped_line_stays_within_the_limit() {
    let controls = vec![1u8; MAX_LINE];
    let shown = escaped(&controls);
    assert!(shown.len() <= MAX_SHOWN, "{}", shown.len());
    assert!(
        shown.ends_with(r"\u{1} [line cut at 16384 bytes once escaped]"),
        "cut between escapes: {}",
        &shown[shown.len() - 60..]
    );
    let backslashes = escaped(&vec![b'\\'; MAX_LINE]);
    assert!(backslashes.ends_with(r"\\ [line cut at 16384 bytes once escaped]"));
    assert_eq!(backslashes.matches('\\').count() % 2, 0, "no backslash left alone");
    // As JSON too (each backslash and quote escaped again): within the bound.
    for (what, line) in
        [("backslashes", vec![b'\\'; 20_000]), ("quotes", vec![b'"'; 20_000]), ("controls", vec![1u8; 20_000])]
    {
        let shown = escaped(&line);
        let json = serde_json::to_string(&shown).expect("json");
        assert!(json.len() <= MAX_SHOWN + 2, "{what}: {} bytes as JSON", json.len());
    }
    let mut plain = vec![b'x'; MAX_LINE];
    plain.extend_from_slice(b" [line cut at 16384 bytes]");
    assert_eq!(escaped(&plain).as_bytes(), &plain[..], "a plain cut line is shown whole");
    assert_eq!(escaped("é\u{1b}".as_bytes()), r"é\u{1b}");
}

#[test]
fn a_flood_is_cut_to_the_rate_and_counted() {
    let t = Instant::now();
    let mut b = budget(t);
    let mut passed = 0;
    for _ in 0..100_000 {
        if b.take(t, 10) {
            passed += 1;
        }
    }
    assert_eq!(passed, BURST as u64);
    assert_eq!(b.lines.dropped, 100_000 - BURST as u64);
    assert_eq!(b.lines.report(t), Some(100_000 - BURST as u64));
    assert_eq!(b.lines.report(t), None, "nothing more to report");
    // A second later, RATE more lines pass.
    let later = t + Duration::from_secs(1);
    let passed = (0..5000).filter(|_| b.take(later, 10)).count();
    assert_eq!(passed, RATE as usize);
    // ... and the drops are reported no sooner than a second after the last report.
    assert_eq!(b.lines.report(later + Duration::from_millis(10)), Some(5000 - RATE as u64));
}

/// Found by review: 200 lines of 16 KiB a second were 3.2 MB/s into the log; then, by the
/// review of that fix, bytes that were refused or cut spent nothing and were read at the
/// pipe's speed. Every byte read is charged: past READ_BURST the pipe waits a tenth of a
/// second's bytes, and one endless line (no newline, cut at MAX_LINE) is read no faster.
#[test]
fn every_byte_read_spends_the_byte_budget() {
    let t = Instant::now();
    let mut b = budget(t);
    b.charge(READ_BURST as usize - 1000);
    assert!(!b.dry(t));
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).expect("pipe");
    let mut c = Capture::new(Role::Node, 42, 7, false, r);
    let endless = vec![b'x'; 60_000];
    assert_eq!(nix::unistd::write(&w, &endless).expect("write"), endless.len());
    let mut shown = 0;
    assert_eq!(c.read(&mut b, &mut |_, _| shown += 1), Read::Dry, "one chunk read, then dry");
    assert_eq!(shown, 0);
    let mut rest = vec![0u8; 65536];
    let left = nix::unistd::read(c.fd.as_fd(), &mut rest).expect("read the rest");
    assert_eq!(left, 60_000 - 8192, "the rest stays in the pipe");
    let wait = b.resume_at().saturating_duration_since(t);
    assert!(wait > Duration::from_millis(100), "a debt, then a tenth of a second's bytes: {wait:?}");
}

/// Lines have a byte rate of their own (found by review: 200 lines of 16 KiB a second were
/// 3.2 MB/s into the log): long lines pass up to BURST_BYTES at once, then RATE_BYTES a
/// second, and one refused for its bytes counts as a dropped line.
#[test]
fn long_lines_are_held_to_a_byte_rate() {
    let t = Instant::now();
    let mut b = budget(t);
    let long = MAX_LINE;
    let passed = (0..1000).filter(|_| b.take(t, long)).count();
    assert_eq!(passed, (BURST_BYTES / (long as f64 + 1.0)) as usize, "the burst, in bytes");
    assert_eq!(b.lines.dropped, 1000 - passed as u64);
    let later = t + Duration::from_secs(1);
    let passed = (0..1000).filter(|_| b.take(later, long)).count();
    assert_eq!(passed, ((RATE_BYTES + BURST_BYTES % (long as f64 + 1.0)) / (long as f64 + 1.0)) as usize);
}

/// Once its budget is spent a role's pipe is not read (`Read::Dry`), and it stays unread
/// until RESUME of a second's budget is back: the flooding role waits in its own `write`.
#[test]
fn a_spent_budget_leaves_the_pipe_unread() {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).expect("pipe");
    let mut c = Capture::new(Role::Node, 42, 7, false, r);
    let flood = b"y\n".repeat(8192);
    assert_eq!(nix::unistd::write(&w, &flood).expect("write"), flood.len());
    let t = Instant::now();
    let mut b = budget(t);
    let mut shown = 0;
    assert_eq!(c.read(&mut b, &mut |_, _| shown += 1), Read::Dry);
    assert_eq!(shown, BURST as usize, "the burst is shown, the rest of what was read dropped");
    // Nothing more is read while it is dry: what the role wrote stays in the pipe.
    let mut left = 0;
    let before = b.lines.dropped_total;
    assert_eq!(c.read(&mut b, &mut |_, _| left += 1), Read::Dry);
    assert_eq!((left, b.lines.dropped_total), (0, before));
    let at = b.resume_at();
    let wait = at.saturating_duration_since(t);
    assert!(
        wait >= Duration::from_millis(95) && wait <= Duration::from_millis(105),
        "RESUME of a second's lines: {wait:?}"
    );
    assert!(!b.dry(at), "readable again once it is back");
}

#[test]
fn control_characters_are_escaped() {
    assert_eq!(crate::logging::log::clean(b"\x1b[31mred\x1b[0m\rINFO x"), "\\u{1b}[31mred\\u{1b}[0m\\u{d}INFO x");
    assert_eq!(crate::logging::log::clean(b"tab\tok \xff"), "tab\tok \u{fffd}");
    // The role's own text "\u{1b}" is not sealnode's escape of ESC: its backslash is doubled.
    assert_eq!(crate::logging::log::clean(b"\\u{1b}"), "\\\\u{1b}");
    // Separators and bidirectional overrides cannot reorder or split what the reader sees.
    assert_eq!(
        crate::logging::log::clean("a\u{2028}b\u{202e}c\u{2066}d".as_bytes()),
        "a\\u{2028}b\\u{202e}c\\u{2066}d"
    );
    // Invisible text: zero-width spaces, soft hyphens, tag characters.
    assert_eq!(crate::logging::log::clean("x\u{200b}\u{ad}\u{e0041}y".as_bytes()), "x\\u{200b}\\u{ad}\\u{e0041}y");
}

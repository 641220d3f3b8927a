//! The canary report in the formats CI systems show natively: JUnit XML (GitLab, GitHub Actions
//! reporters, Jenkins) and TAP 13 (`prove`, TAP consumers). One test case per attempt and role; a
//! refused attempt passes, an attempt that succeeded fails with what happened.

use super::{AttemptResult, Report};

/// What the attempt's outcome was, in one line (the failure message, or the pass detail).
fn detail(a: &AttemptResult) -> String {
    let how = match (a.signal, &a.errno_name) {
        (Some(sig), _) => format!("signal {sig}"),
        (None, Some(n)) => n.clone(),
        (None, None) => "no error".into(),
    };
    let exp: Vec<&str> = a.expected_layers.iter().map(|l| l.name()).collect();
    match a.refused_by {
        Some(l) => format!("refused by {} ({how}); expected {}", l.name(), exp.join(",")),
        None => format!("{}: the attempt SUCCEEDED ({how}); expected a refusal by {}", a.description, exp.join(",")),
    }
}

/// Control characters (line breaks above all) become spaces.
fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// JUnit XML: one `<testsuite>` per role (`sealnode.canary.<role>`), one `<testcase>` per attempt.
pub fn junit(report: &Report) -> Result<String, quick_junit::SerializeError> {
    use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
    let mut out = quick_junit::Report::new("sealnode canary");
    for r in &report.roles {
        let mut suite = TestSuite::new(format!("sealnode.canary.{}", r.role));
        for a in &r.attempts {
            let status = if a.outcome == "refused" {
                TestCaseStatus::success()
            } else {
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                s.set_message(detail(a)).set_type("escape");
                s
            };
            let mut case = TestCase::new(a.id, status);
            case.set_classname(format!("sealnode.canary.{}.{}", r.role, a.category));
            case.set_system_out(format!("{}\n{}\n", a.description, detail(a)));
            suite.add_test_case(case);
        }
        out.add_test_suite(suite);
    }
    out.to_string()
}

/// TAP version 13: `ok N - <role>/<id>` for a refusal, `not ok` with a YAML diagnostic for an escape.
pub fn tap(report: &Report) -> String {
    let total: usize = report.roles.iter().map(|r| r.attempts.len()).sum();
    let mut s = format!("TAP version 13\n1..{total}\n");
    let mut n = 0;
    for r in &report.roles {
        for a in &r.attempts {
            n += 1;
            // '#' starts a TAP directive and a line break would start a new TAP line: neither may
            // reach the output from a description.
            let desc = one_line(a.description).replace('#', "");
            if a.outcome == "refused" {
                s.push_str(&format!("ok {n} - {}/{} {desc}\n", r.role, a.id));
            } else {
                s.push_str(&format!("not ok {n} - {}/{} {desc}\n", r.role, a.id));
                s.push_str("  ---\n");
                s.push_str(&format!("  message: '{}'\n", one_line(&detail(a)).replace('\'', "''")));
                s.push_str(&format!("  severity: fail\n  role: {}\n  category: {}\n  ...\n", r.role, a.category));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Role;
    use crate::proof::canary::{Layer, RoleReport};

    fn attempt(id: &'static str, refused: bool) -> AttemptResult {
        AttemptResult {
            id,
            category: "fs",
            description: "write <outside> & \"quote\" # hash\nok 9 - injected",
            outcome: if refused { "refused" } else { "succeeded" },
            errno: refused.then_some(13),
            errno_name: refused.then(|| "EACCES".to_string()),
            signal: None,
            expected_layers: vec![Layer::Landlock, Layer::Namespaces],
            refused_by: refused.then_some(Layer::Landlock),
        }
    }

    fn report() -> Report {
        Report {
            schema: 1,
            sealnode_version: "test",
            roles: vec![RoleReport {
                role: Role::Node,
                attempts: vec![attempt("a-refused", true), attempt("b-escaped", false)],
                refused: 1,
                succeeded: 1,
            }],
            passed: false,
        }
    }

    #[test]
    fn junit_marks_escapes_as_failures_and_escapes_xml() {
        let x = junit(&report()).expect("serialize");
        assert!(x.contains(r#"<testsuite name="sealnode.canary.node" tests="2""#), "{x}");
        assert!(x.contains(r#"failures="1""#), "{x}");
        assert!(x.contains(r#"<testcase name="b-escaped" classname="sealnode.canary.node.fs">"#), "{x}");
        assert!(x.contains("the attempt SUCCEEDED"), "{x}");
        assert!(x.contains("&lt;outside&gt; &amp;"), "{x}");
        assert!(!x.contains("<outside>"), "{x}");
    }

    #[test]
    fn tap_numbers_every_attempt_and_explains_failures() {
        let t = tap(&report());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "TAP version 13");
        assert_eq!(lines[1], "1..2");
        assert!(lines[2].starts_with("ok 1 - node/a-refused "), "{t}");
        assert!(!lines[2].contains('#'), "{t}");
        assert!(lines[3].starts_with("not ok 2 - node/b-escaped "), "{t}");
        assert!(t.contains("  message: 'write <outside>"), "{t}");
        // A line break in a description cannot forge a TAP line.
        assert_eq!(lines.len(), 4 + 6, "{t}");
        assert!(!t.lines().any(|l| l.starts_with("ok 9")), "{t}");
    }
}

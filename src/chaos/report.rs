//! A chaos run as a table for the terminal, a JSON document and an SVG picture of the
//! timelines (one row per trial, one colour per phase). Pure: text in, text out.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::data::DataCheck;
use super::invariants::{Expect, TrialRecord, Violation, check};
use super::preflight::Bystander;
use super::timeline::Phase;

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct Run {
    /// e.g. `statefulset shop/db`.
    pub workload: String,
    /// The fault's built-in name, or `custom`.
    pub fault: String,
    pub records: Vec<TrialRecord>,
}

impl Run {
    /// Every violation of every trial, with its trial number.
    pub fn violations(&self) -> Vec<(usize, Violation)> {
        self.records
            .iter()
            .flat_map(|r| check(r).into_iter().map(move |v| (r.trial, v)))
            .collect()
    }
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

fn cell(d: Option<Duration>) -> String {
    d.map_or("-".to_string(), |d| format!("{:.1}s", d.as_secs_f64()))
}

/// A trial's data check in a few words: `not checked`, `split-brain 0, lost 0 (412 writes)`, or
/// why there is no report.
pub fn data_cell(data: &Option<DataCheck>) -> String {
    match data {
        None => "not checked".to_string(),
        Some(DataCheck { result: Ok(r), .. }) => {
            let writes = r
                .accepted_writes
                .map_or(String::new(), |n| format!(" ({n} writes)"));
            format!(
                "split-brain {}, lost {}{writes}",
                r.split_brain_writes.len(),
                r.lost_acknowledged_writes.len()
            )
        }
        Some(DataCheck { result: Err(_), .. }) => "no report".to_string(),
    }
}

/// The trials as an aligned table.
pub fn table(run: &Run) -> String {
    let header = [
        "trial", "pod", "node", "target", "detect", "act", "detach", "recover", "total", "data",
        "result",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in &run.records {
        let t = &r.timeline;
        let violated: Vec<&str> = check(r).iter().map(|v| v.invariant).collect();
        let mut row = vec![
            r.trial.to_string(),
            r.pod.clone(),
            t.node.clone(),
            t.target.clone().unwrap_or_else(|| "-".into()),
        ];
        row.extend(Phase::ALL.iter().map(|&p| cell(t.phase(p))));
        row.push(match (t.recovered, r.expect, t.hold_broken()) {
            (Some(d), ..) => cell(Some(d)),
            (None, Expect::Held, None) => format!("held {:.0}s", t.waited.as_secs_f64()),
            (None, Expect::Held, Some(s)) => format!("acted {:.1}s", s.at.as_secs_f64()),
            (None, Expect::Moved, _) => format!(">{:.0}s", t.waited.as_secs_f64()),
        });
        row.push(data_cell(&r.data));
        row.push(if violated.is_empty() {
            "ok".to_string()
        } else {
            format!("FAILED: {}", violated.join(", "))
        });
        rows.push(row);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                // Text columns left, figures right.
                if (4..9).contains(&i) {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[derive(Serialize)]
struct JsonRun<'a> {
    workload: &'a str,
    fault: &'a str,
    passed: bool,
    trials: Vec<JsonTrial<'a>>,
}

#[derive(Serialize)]
struct JsonTrial<'a> {
    trial: usize,
    expect: Expect,
    pod: &'a str,
    policy: &'a str,
    node: &'a str,
    target: Option<&'a str>,
    fault_command: &'a str,
    recovered_s: Option<f64>,
    waited_s: f64,
    phases_s: BTreeMap<&'static str, f64>,
    steps: Vec<JsonStep<'a>>,
    bystanders: &'a [Bystander],
    lost: &'a [Bystander],
    restore: Option<JsonRestore<'a>>,
    /// `null` when not checked.
    data: Option<JsonData<'a>>,
    /// The workload's own check (`--check`), before the fault and after the trial.
    checks: Vec<JsonCheck<'a>>,
    violations: Vec<Violation>,
}

#[derive(Serialize)]
struct JsonCheck<'a> {
    when: crate::chaos::own_check::When,
    command: &'a str,
    passed: bool,
    /// The last line it printed, or why it failed.
    said: &'a str,
    took_s: f64,
}

#[derive(Serialize)]
struct JsonData<'a> {
    command: &'a str,
    split_brain_writes: Option<usize>,
    lost_acknowledged_writes: Option<usize>,
    accepted_writes: Option<u64>,
    refused_writes: Option<u64>,
    error: Option<String>,
}

#[derive(Serialize)]
struct JsonStep<'a> {
    key: &'static str,
    what: &'a str,
    at_s: f64,
}

#[derive(Serialize)]
struct JsonRestore<'a> {
    command: &'a str,
    node_ready_s: Option<f64>,
    taint_gone_s: Option<f64>,
    waited_s: f64,
    remaining_taint: Option<&'a str>,
}

/// The run as pretty-printed JSON; times in seconds from each trial's fault (restore times
/// from the restore).
pub fn json(run: &Run) -> String {
    let trials: Vec<JsonTrial<'_>> = run
        .records
        .iter()
        .map(|r| {
            let t = &r.timeline;
            JsonTrial {
                trial: r.trial,
                expect: r.expect,
                pod: &r.pod,
                policy: &r.policy,
                node: &t.node,
                target: t.target.as_deref(),
                fault_command: &r.fault_command,
                recovered_s: t.recovered.map(secs),
                waited_s: secs(t.waited),
                phases_s: t
                    .spans()
                    .iter()
                    .map(|s| (s.phase.as_str(), secs(s.duration())))
                    .collect(),
                steps: t
                    .steps
                    .iter()
                    .map(|s| JsonStep {
                        key: s.key,
                        what: &s.what,
                        at_s: secs(s.at),
                    })
                    .collect(),
                bystanders: &r.bystanders,
                lost: &r.lost,
                restore: r.restore.as_ref().map(|x| JsonRestore {
                    command: &x.command,
                    node_ready_s: x.node_ready.map(secs),
                    taint_gone_s: x.taint_gone.map(secs),
                    waited_s: secs(x.waited),
                    remaining_taint: x.remaining_taint.as_deref(),
                }),
                data: r.data.as_ref().map(|d| {
                    let report = d.result.as_ref().ok();
                    JsonData {
                        command: &d.command,
                        split_brain_writes: report.map(|r| r.split_brain_writes.len()),
                        lost_acknowledged_writes: report.map(|r| r.lost_acknowledged_writes.len()),
                        accepted_writes: report.and_then(|r| r.accepted_writes),
                        refused_writes: report.and_then(|r| r.refused_writes),
                        error: d.result.as_ref().err().map(ToString::to_string),
                    }
                }),
                checks: r
                    .checks
                    .iter()
                    .map(|c| JsonCheck {
                        when: c.when,
                        command: &c.command,
                        passed: c.passed(),
                        said: c.result.as_deref().unwrap_or_else(|why| why.as_str()),
                        took_s: secs(c.took),
                    })
                    .collect(),
                violations: check(r),
            }
        })
        .collect();
    let doc = JsonRun {
        workload: &run.workload,
        fault: &run.fault,
        passed: trials.iter().all(|t| t.violations.is_empty()),
        trials,
    };
    // Plain data: serialization cannot fail.
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

const PHASE_COLOURS: [(Phase, &str); 4] = [
    (Phase::Detect, "#4e79a7"),
    (Phase::Act, "#f28e2b"),
    (Phase::Detach, "#e15759"),
    (Phase::Recover, "#59a14f"),
];
const UNFINISHED: &str = "#bab0ac";
/// A trial that should hold, for as long as it was followed.
const HELD: &str = "#76b7b2";

const WIDTH: f64 = 960.0;
const LABEL: f64 = 200.0;
const RIGHT: f64 = 90.0;
const TOP: f64 = 48.0;
const ROW: f64 = 34.0;
const BAR: f64 = 18.0;

/// A tick step that gives at most ten ticks up to `max` seconds.
fn tick_step(max: f64) -> f64 {
    [1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0]
        .into_iter()
        .find(|s| max / s <= 10.0)
        .unwrap_or(1200.0)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The timelines as an SVG document: one row per trial, a coloured bar per phase, a mark per
/// step (hover for its text), seconds on the axis, and a legend.
pub fn svg(run: &Run) -> String {
    let longest = run
        .records
        .iter()
        .map(|r| {
            r.timeline
                .recovered
                .unwrap_or(r.timeline.waited)
                .as_secs_f64()
        })
        .fold(1.0, f64::max);
    let step = tick_step(longest);
    let axis_max = (longest / step).ceil() * step;
    let plot = WIDTH - LABEL - RIGHT;
    let x = |s: f64| LABEL + s / axis_max * plot;
    let rows = run.records.len() as f64;
    let axis_y = TOP + rows * ROW + 6.0;
    let height = axis_y + 80.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="24" font-size="15" font-weight="bold">podha chaos: {} — fault {} ({} trial{})</text>"#,
        escape(&run.workload),
        escape(&run.fault),
        run.records.len(),
        if run.records.len() == 1 { "" } else { "s" }
    );
    // Grid and axis.
    let mut tick = 0.0;
    while tick <= axis_max + 1e-9 {
        let tx = x(tick);
        let _ = writeln!(
            out,
            r##"<line x1="{tx:.1}" y1="{TOP}" x2="{tx:.1}" y2="{axis_y}" stroke="#e0e0e0"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle">{tick}</text>"##,
            axis_y + 16.0
        );
        tick += step;
    }
    let _ = writeln!(
        out,
        r#"<line x1="{LABEL}" y1="{axis_y}" x2="{:.1}" y2="{axis_y}" stroke="black"/><text x="{:.1}" y="{:.1}" text-anchor="middle">seconds after the fault</text>"#,
        x(axis_max),
        LABEL + plot / 2.0,
        axis_y + 34.0
    );
    for (i, r) in run.records.iter().enumerate() {
        svg_trial(&mut out, r, TOP + i as f64 * ROW + (ROW - BAR) / 2.0, &x);
    }
    svg_legend(&mut out, axis_y + 52.0);
    out.push_str("</svg>\n");
    out
}

/// One trial's row at height `y`: its label, a bar per phase, a mark per step and the outcome.
fn svg_trial(out: &mut String, r: &TrialRecord, y: f64, x: &dyn Fn(f64) -> f64) {
    let t = &r.timeline;
    let violated: Vec<&str> = check(r).iter().map(|v| v.invariant).collect();
    let failed = !violated.is_empty();
    let label = match (&t.target, r.expect) {
        // A trial that held has no target to wait for.
        (None, Expect::Held) => format!("trial {} {}", r.trial, t.node),
        (target, _) => format!(
            "trial {} {} → {}",
            r.trial,
            t.node,
            target.as_deref().unwrap_or("?")
        ),
    };
    let _ = writeln!(
        out,
        r##"<text x="10" y="{:.1}" fill="{}">{}</text>"##,
        y + BAR - 4.0,
        if failed { "#c00000" } else { "black" },
        escape(&label)
    );
    let spans = t.spans();
    for s in &spans {
        let colour = PHASE_COLOURS
            .iter()
            .find(|(p, _)| *p == s.phase)
            .map_or(UNFINISHED, |(_, c)| c);
        let (x0, x1) = (x(s.start.as_secs_f64()), x(s.end.as_secs_f64()));
        let _ = writeln!(
            out,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{BAR}" fill="{colour}"><title>{}: {:.1}s</title></rect>"#,
            (x1 - x0).max(0.0),
            s.phase.as_str(),
            s.duration().as_secs_f64()
        );
    }
    let unfinished = match r.expect {
        Expect::Held if t.hold_broken().is_none() => ("held", HELD),
        _ => ("not recovered", UNFINISHED),
    };
    if t.recovered.is_none() {
        let from = spans.last().map_or(0.0, |s| s.end.as_secs_f64());
        let (x0, x1) = (x(from), x(t.waited.as_secs_f64()));
        let _ = writeln!(
            out,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{BAR}" fill="{}"><title>{}</title></rect>"#,
            (x1 - x0).max(0.0),
            unfinished.1,
            unfinished.0
        );
    }
    for s in &t.steps {
        let sx = x(s.at.as_secs_f64());
        let _ = writeln!(
            out,
            r#"<line x1="{sx:.1}" y1="{:.1}" x2="{sx:.1}" y2="{:.1}" stroke="black"><title>{:.1}s {}</title></line>"#,
            y - 3.0,
            y + BAR + 3.0,
            s.at.as_secs_f64(),
            escape(&s.what)
        );
    }
    let end = t.recovered.unwrap_or(t.waited).as_secs_f64();
    let outcome = match t.recovered {
        Some(_) => format!("{end:.1}s"),
        None => format!("{} ({end:.0}s)", unfinished.0),
    };
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}">{}{}</text>"#,
        x(end) + 6.0,
        y + BAR - 4.0,
        outcome,
        if failed {
            format!(" ✗ {}", violated.join(", "))
        } else {
            String::new()
        }
    );
}

/// The phases' colours, below the axis at height `ly`.
fn svg_legend(out: &mut String, ly: f64) {
    let legend = PHASE_COLOURS
        .iter()
        .map(|(p, c)| (p.as_str(), *c))
        .chain([("not recovered", UNFINISHED), ("held", HELD)]);
    for (i, (name, colour)) in legend.enumerate() {
        let lx = LABEL + i as f64 * 115.0;
        let _ = writeln!(
            out,
            r#"<rect x="{lx}" y="{ly}" width="14" height="14" fill="{colour}"/><text x="{}" y="{}">{name}</text>"#,
            lx + 20.0,
            ly + 12.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::invariants::tests::recorded;

    fn run(records: Vec<TrialRecord>) -> Run {
        Run {
            workload: "statefulset shop/db".into(),
            fault: "kind-kill".into(),
            records,
        }
    }

    #[test]
    fn the_table_has_a_row_per_trial_with_phases_and_the_result() {
        let text = table(&run(vec![recorded(1, Some(25)), recorded(2, None)]));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("trial  pod"), "{text}");
        for figure in ["14.0s", "1.0s", "2.0s", "8.0s", "25.0s"] {
            assert!(lines[1].contains(figure), "{figure} missing: {text}");
        }
        assert!(lines[1].ends_with("ok"), "{text}");
        assert!(lines[2].contains(">60s"), "{text}");
        assert!(lines[2].ends_with("FAILED: replacement-running"), "{text}");
    }

    #[test]
    fn json_carries_phases_steps_and_violations() {
        let doc: serde_json::Value =
            serde_json::from_str(&json(&run(vec![recorded(1, Some(25)), recorded(2, None)])))
                .unwrap();
        assert_eq!(doc["passed"], false);
        let first = &doc["trials"][0];
        assert_eq!(first["phases_s"]["detect"], 14.0);
        assert_eq!(first["phases_s"]["recover"], 8.0);
        assert_eq!(first["recovered_s"], 25.0);
        assert_eq!(first["steps"][0]["key"], "taint");
        assert_eq!(first["restore"]["taint_gone_s"], 7.0);
        assert_eq!(first["violations"], serde_json::json!([]));
        let second = &doc["trials"][1];
        assert_eq!(second["recovered_s"], serde_json::Value::Null);
        assert_eq!(second["violations"][0]["invariant"], "replacement-running");
        let passing = json(&run(vec![recorded(1, Some(25))]));
        assert!(passing.contains("\"passed\": true"), "{passing}");
    }

    #[test]
    fn json_carries_the_workloads_own_checks() {
        use crate::chaos::own_check::{CheckRun, When};
        let mut r = recorded(1, Some(25));
        r.checks = vec![
            CheckRun {
                when: When::Before,
                command: "check.sh".into(),
                result: Ok("verdict lost=0".into()),
                took: Duration::from_millis(1500),
            },
            CheckRun {
                when: When::After,
                command: "check.sh".into(),
                result: Err("exit code 1: 3 lost".into()),
                took: Duration::from_secs(2),
            },
        ];
        let doc: serde_json::Value = serde_json::from_str(&json(&run(vec![r]))).unwrap();
        let checks = &doc["trials"][0]["checks"];
        assert_eq!(checks[0]["when"], "before");
        assert_eq!(checks[0]["said"], "verdict lost=0");
        assert_eq!(checks[0]["took_s"], 1.5);
        assert_eq!(checks[1]["passed"], false);
        assert_eq!(checks[1]["said"], "exit code 1: 3 lost");
        assert_eq!(
            doc["trials"][0]["violations"][0]["invariant"],
            "check-passes"
        );
        assert_eq!(doc["passed"], false);
    }

    #[test]
    fn the_svg_draws_a_row_per_trial_a_colour_per_phase_a_legend_and_an_axis() {
        let mut odd = recorded(2, None);
        odd.timeline.steps[0].what = "a <b> & \"c\"".into();
        let text = svg(&run(vec![recorded(1, Some(25)), odd]));
        assert!(text.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(text.trim_end().ends_with("</svg>"));
        for (phase, colour) in PHASE_COLOURS {
            let bar = format!("fill=\"{colour}\"><title>{}:", phase.as_str());
            assert!(text.contains(&bar), "no {} bar: {text}", phase.as_str());
            assert!(
                text.contains(&format!(">{}</text>", phase.as_str())),
                "legend"
            );
        }
        assert!(text.contains("<title>not recovered</title>"), "{text}");
        assert!(text.contains("trial 1 n1 → n2") && text.contains("trial 2 n1 → ?"));
        assert!(text.contains("seconds after the fault"));
        // 60 s at most: ticks every 10 s.
        assert!(
            text.contains(">60</text>") && !text.contains(">70</text>"),
            "{text}"
        );
        assert!(
            text.contains("a &lt;b&gt; &amp; &quot;c&quot;"),
            "escaped: {text}"
        );
        // The failed trial is marked.
        assert!(
            text.contains("not recovered (60s) ✗ replacement-running"),
            "{text}"
        );
        assert!(text.contains("(2 trials)"), "{text}");
    }

    #[test]
    fn a_hold_reads_as_held_in_the_table_the_json_and_the_picture() {
        let held = crate::chaos::invariants::tests::held(1, &[("notready", 40)]);
        let broken = crate::chaos::invariants::tests::held(2, &[("taint", 30)]);
        let fence = crate::chaos::invariants::tests::held(3, &[("fence-requested", 35)]);
        let runs = run(vec![held, broken, fence]);
        let text = table(&runs);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].contains("held 60s") && lines[1].ends_with("ok"),
            "{text}"
        );
        assert!(
            lines[2].contains("acted 30.0s") && lines[2].ends_with("FAILED: held"),
            "{text}"
        );
        // A fence request breaks a hold before any taint, and the table says when.
        assert!(
            lines[3].contains("acted 35.0s") && lines[3].ends_with("FAILED: held"),
            "{text}"
        );
        let doc: serde_json::Value = serde_json::from_str(&json(&runs)).unwrap();
        assert_eq!(doc["trials"][0]["expect"], "held");
        assert_eq!(doc["trials"][0]["violations"], serde_json::json!([]));
        assert_eq!(doc["trials"][1]["violations"][0]["invariant"], "held");
        let picture = svg(&runs);
        assert!(
            picture.contains(&format!("fill=\"{HELD}\"><title>held</title>")),
            "{picture}"
        );
        assert!(picture.contains(">held (60s)</text>"), "{picture}");
        assert!(picture.contains(">trial 1 n1</text>"), "{picture}");
        assert!(picture.contains("not recovered (60s) ✗ held"), "{picture}");
        assert_eq!(
            picture.matches("<title>held</title>").count(),
            1,
            "{picture}"
        );
        let moved: serde_json::Value =
            serde_json::from_str(&json(&run(vec![recorded(1, Some(25))]))).unwrap();
        assert_eq!(moved["trials"][0]["expect"], "moved");
    }

    #[test]
    fn ticks_stay_few() {
        assert_eq!(tick_step(8.0), 1.0);
        assert_eq!(tick_step(25.0), 5.0);
        assert_eq!(tick_step(400.0), 60.0);
    }
}

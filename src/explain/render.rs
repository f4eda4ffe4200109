//! The explanations as tables for a terminal.

use std::fmt::Write as _;

use super::policy::EVENT_TTL_DEFAULT;
use super::{Check, NodeExplanation, Outcome, PodExplanation, PolicyExplanation};

fn outcome(o: Outcome) -> &'static str {
    match o {
        Outcome::Pass => "ok",
        Outcome::Fail => "NO",
        Outcome::Note => "note",
        Outcome::Slow => "SLOW",
    }
}

/// Rows padded to their widest cell per column; the last column is not padded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: &mut dyn Iterator<Item = &str>, out: &mut String| {
        let cells: Vec<&str> = cells.collect();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                let _ = write!(out, "{cell}{}  ", " ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(&mut header.iter().copied(), &mut out);
    for row in rows {
        line(&mut row.iter().map(String::as_str), &mut out);
    }
    out
}

fn checks_table(checks: &[Check]) -> String {
    let rows: Vec<Vec<String>> = checks
        .iter()
        .map(|c| {
            vec![
                c.rule.to_string(),
                outcome(c.outcome).to_string(),
                c.detail.clone(),
            ]
        })
        .collect();
    table(&["RULE", "", "DETAIL"], &rows)
}

pub fn pod(e: &PodExplanation) -> String {
    let verdict = match e.first_failure() {
        None if e.slow() => format!(
            "protected, slowly: podha would fail it over if {} died now, but the out-of-service \
             taint would be refused there and its volume would detach only after the \
             attach/detach controller's 6-minute wait (see taint)",
            e.node.as_deref().unwrap_or("its node")
        ),
        None => format!(
            "protected: podha would fail it over if {} died now",
            e.node.as_deref().unwrap_or("its node")
        ),
        Some(c) => format!("NOT protected: {}", c.rule),
    };
    format!("pod {}: {verdict}\n\n{}", e.pod, checks_table(&e.checks))
}

pub fn node(e: &NodeExplanation) -> String {
    let mut out = format!(
        "node {}: {}\n\n{}",
        e.node,
        if e.protected {
            "podha could fail its pods over if it died now"
        } else {
            "NOT protected"
        },
        checks_table(&e.checks)
    );
    if e.pods.is_empty() {
        out.push_str("\nno pod with a volume on it\n");
        return out;
    }
    let rows: Vec<Vec<String>> = e
        .pods
        .iter()
        .map(|p| {
            vec![
                p.pod.clone(),
                if p.protected { "yes" } else { "NO" }.to_string(),
                p.because
                    .as_ref()
                    .map_or_else(String::new, |c| format!("{}: {}", c.rule, c.detail)),
            ]
        })
        .collect();
    out.push_str("\npods with volumes:\n");
    out.push_str(&table(&["POD", "PROTECTED", "WHY NOT"], &rows));
    out
}

pub fn policy(e: &PolicyExplanation) -> String {
    let mut out = format!("policy {}\n\n", e.policy);
    let choices: Vec<Vec<String>> = e
        .choices
        .iter()
        .map(|(k, v)| vec![k.clone(), v.clone()])
        .collect();
    out.push_str(&table(&["SPEC", ""], &choices));
    let _ = writeln!(
        out,
        "\nnodes: {} watched, {} failed, {} suspect",
        e.watched_nodes, e.failed_nodes, e.suspect_nodes
    );
    if !e.conditions.is_empty() {
        let rows: Vec<Vec<String>> = e
            .conditions
            .iter()
            .map(|c| {
                vec![
                    c.kind.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["CONDITION", "STATUS", "REASON", "MESSAGE"], &rows));
    }
    let c = &e.coverage;
    let _ = writeln!(
        out,
        "\npods with volumes it selects: {} protected, {} not",
        c.protected, c.unprotected
    );
    for (reason, count) in &c.reasons {
        let _ = writeln!(out, "  {count} not protected: {}", reason.as_str());
    }
    if c.slow > 0 {
        let _ = writeln!(
            out,
            "  {} of the protected only after the 6-minute wait: the out-of-service taint would \
             be refused on their node (podha explain node NODE says which pod must stay)",
            c.slow
        );
    }
    if c.rehearsed > 0 {
        let _ = writeln!(
            out,
            "  {} of them in a dry run: those counted under another reason than DryRun stay \
             unprotected once dryRun is off",
            c.rehearsed
        );
    }
    for (pod, why) in &c.examples {
        let _ = writeln!(out, "  e.g. {pod}: {why}");
    }
    out.push_str(&failovers(e));
    out.push_str(&events(e));
    out
}

fn failovers(e: &PolicyExplanation) -> String {
    let mut out = String::new();
    if e.failovers.is_empty() {
        out.push_str("\nno failover in its status\n");
    } else {
        let rows: Vec<Vec<String>> = e
            .failovers
            .iter()
            .map(|f| {
                let t = |d: &Option<String>| d.clone().unwrap_or_else(|| "-".into());
                vec![
                    f.node.clone(),
                    f.detected_at.clone(),
                    f.phase.clone(),
                    t(&f.acted_after),
                    t(&f.detached_after),
                    t(&f.recovered_after),
                    [f.pods.join(" "), f.message.clone().unwrap_or_default()]
                        .join(" ")
                        .trim()
                        .to_string(),
                ]
            })
            .collect();
        out.push_str("\nrecent failovers (newest first; times after the detection):\n");
        out.push_str(&table(
            &[
                "NODE",
                "DETECTED",
                "PHASE",
                "ACTED",
                "DETACHED",
                "RECOVERED",
                "PODS / NOTE",
            ],
            &rows,
        ));
    }
    out
}

fn events(e: &PolicyExplanation) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nevents (the API server keeps them {EVENT_TTL_DEFAULT} unless its --event-ttl says \
         otherwise; the status keeps the last 10 failovers):"
    );
    if let Some(why) = &e.events_unread {
        let _ = writeln!(out, "  cannot be read: {why}");
    } else if e.events.is_empty() {
        out.push_str("  none\n");
    } else {
        let rows: Vec<Vec<String>> = e
            .events
            .iter()
            .map(|ev| {
                vec![
                    ev.time.clone(),
                    ev.kind.clone(),
                    ev.reason.clone(),
                    ev.count.to_string(),
                    ev.message.clone(),
                ]
            })
            .collect();
        out.push_str(&table(
            &["TIME", "TYPE", "REASON", "COUNT", "MESSAGE"],
            &rows,
        ));
    }
    out
}

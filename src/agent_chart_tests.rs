//! The chart's values for the agents, the defaults of `podha agent` and podha's default
//! `fencing.agentMargin` are one set of timings: the chart passes its values to the agent as
//! flags, so they must be what the agent takes when run alone, and together they must hold the
//! bounds the agent checks at start and the margin podha's silence proof relies on.

use std::time::Duration;

use clap::Parser;

use crate::agent::AgentArgs;
use crate::api::Fencing;

const VALUES: &str = include_str!("../charts/podha/values.yaml");

#[derive(Parser)]
struct AgentCommand {
    #[command(flatten)]
    args: AgentArgs,
}

/// A duration value of the chart, as `humantime` reads it (the agent's flags take the same).
fn duration(value: &serde_norway::Value, what: &str) -> Duration {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("{what} is a duration in values.yaml"));
    humantime::parse_duration(text).unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn the_charts_agent_values_are_the_agents_defaults_and_hold_the_proofs_bounds() {
    let values: serde_norway::Value = serde_norway::from_str(VALUES).expect("values.yaml");
    let agent = &values["agent"];
    let watchdog = duration(&agent["watchdog"]["timeout"], "agent.watchdog.timeout");
    let run_alone = AgentCommand::try_parse_from([
        "agent",
        "--node=n1",
        "--fence=sysrq-reboot",
        "--hearing-file=/run/podha-agent/n1/heard",
        "--watchdog=/dev/watchdog",
        &format!(
            "--watchdog-timeout={}",
            humantime::format_duration(watchdog)
        ),
    ])
    .expect("the agent's flags")
    .args;
    assert_eq!(
        run_alone.isolation_timeout,
        duration(&agent["isolationTimeout"], "agent.isolationTimeout"),
        "agent.isolationTimeout and --isolation-timeout's default"
    );
    assert_eq!(
        run_alone.check_interval,
        duration(&agent["checkInterval"], "agent.checkInterval"),
        "agent.checkInterval and --check-interval's default"
    );
    assert_eq!(
        run_alone.survey_timeout,
        duration(&agent["surveyTimeout"], "agent.surveyTimeout"),
        "agent.surveyTimeout and --survey-timeout's default"
    );
    assert_eq!(
        Some(u64::from(run_alone.listen.port())),
        agent["port"].as_u64(),
        "agent.port and --listen's default port"
    );
    run_alone
        .check()
        .expect("the chart's timings hold the bounds the agent checks at start");
    // An Intel iTCO_wdt resets only at its second timeout, which the agent counts: at the
    // chart's isolation timeout it does not fit (the agent runs without it and says why), and
    // the one value the chart's comment names, `isolationTimeout: 24s`, makes it fit.
    let itco = crate::agent::watchdog::timeouts_to_reset("iTCO_wdt");
    let bounds = run_alone.watchdog_bounds();
    assert!(
        bounds.check_span(watchdog, watchdog * itco).is_err(),
        "an iTCO watchdog of {watchdog:?} fits the chart's timings: values.yaml says it does not"
    );
    let longer = crate::agent::watchdog::Bounds {
        isolation_timeout: Duration::from_secs(24),
        ..bounds
    };
    longer
        .check_span(watchdog, watchdog * itco)
        .expect("an iTCO watchdog fits isolationTimeout 24s, as values.yaml says");
    // podha's default margin is what the chart's comment and docs/agent.md count with.
    let margin: Duration = Fencing::default().agent_margin.into();
    assert_eq!(margin, Duration::from_secs(4));
}

/// The chart's example policy writes out podha's defaults, detection and proof: what it says
/// is what an empty spec gets.
#[test]
fn the_charts_example_policy_writes_out_the_defaults() {
    let values: serde_norway::Value = serde_norway::from_str(VALUES).expect("values.yaml");
    let spec = &values["policies"][0]["spec"];
    let detection: crate::api::Detection =
        serde_norway::from_value(spec["detection"].clone()).expect("the example's detection");
    assert_eq!(detection, crate::api::Detection::default());
    let fencing: Fencing =
        serde_norway::from_value(spec["fencing"].clone()).expect("the example's fencing");
    assert_eq!(fencing, Fencing::default());
}

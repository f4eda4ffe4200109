//! podha's Redfish client (`podha::redfish`) against a real Redfish service: the sushy-tools
//! emulator with its fake systems driver, over HTTPS and basic auth (`make sushy-tools`
//! installs it; `podha_sim::cluster::redfish` runs it). Each test starts its own emulator.

use std::path::PathBuf;
use std::time::Duration;

use podha::redfish::{Bmc, Endpoint, Error, PowerState, ResetType, Trust};
use podha_sim::cluster::redfish::{Emulator, EmulatorConfig, FakeSystem};

const USER: &str = "podha";
const PASSWORD: &str = "fence-me";
/// The fake driver applies a power change 0–11 s after the request, on a read.
const APPLY_WITHIN: Duration = Duration::from_secs(20);

fn dir(test: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("redfish-{test}"))
}

fn emulator(test: &str, systems: &[(&str, bool)], power_off_disabled: bool) -> Emulator {
    let systems = systems
        .iter()
        .map(|(name, on)| FakeSystem::new(name, *on).expect("a system"))
        .collect();
    let config = EmulatorConfig {
        systems,
        username: USER.to_string(),
        password: PASSWORD.to_string(),
        power_off_disabled,
        also_at: None,
    };
    Emulator::start(&dir(test), &config).unwrap_or_else(|e| panic!("{e}"))
}

fn endpoint(emulator: &Emulator, system: Option<&str>) -> Endpoint {
    Endpoint::new(
        &emulator.address(),
        system.map(str::to_string),
        USER.to_string(),
        PASSWORD.to_string(),
        ca_of(emulator.ca_pem()),
    )
    .expect("a valid endpoint")
}

fn bmc(endpoint: Endpoint) -> Bmc {
    Bmc::new(endpoint).expect("a client")
}

/// Reads the power state until it is `wanted`, as podha's fence does.
async fn wait_for(bmc: &Bmc, wanted: &PowerState) -> PowerState {
    let deadline = tokio::time::Instant::now() + APPLY_WITHIN;
    loop {
        let state = bmc.power_state().await.expect("a power state");
        if &state == wanted || tokio::time::Instant::now() > deadline {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn a_force_off_is_confirmed_only_by_the_state_the_bmc_reports() {
    let emulator = emulator("force-off", &[("node-a", true), ("node-b", true)], false);
    let node_a = bmc(endpoint(&emulator, Some("node-a")));
    let node_b = bmc(endpoint(&emulator, Some("node-b")));
    assert_eq!(node_a.power_state().await.unwrap(), PowerState::On);
    node_a
        .reset(ResetType::ForceOff)
        .await
        .expect("the reset taken");
    assert_eq!(wait_for(&node_a, &PowerState::Off).await, PowerState::Off);

    // A second ForceOff of a machine that is off is taken and changes nothing.
    node_a
        .reset(ResetType::ForceOff)
        .await
        .expect("an idempotent reset");
    assert_eq!(node_a.power_state().await.unwrap(), PowerState::Off);

    node_a
        .reset(ResetType::On)
        .await
        .expect("the power-on taken");
    assert_eq!(wait_for(&node_a, &PowerState::On).await, PowerState::On);

    // Every reset went to node-a's own action, none to node-b, which stayed on.
    let uuid_of_a = &emulator.system("node-a").uuid;
    let posts: Vec<String> = emulator
        .requests()
        .unwrap()
        .into_iter()
        .filter(|r| r.starts_with("POST"))
        .collect();
    assert_eq!(posts.len(), 3, "{posts:?}");
    let own = format!("POST /redfish/v1/Systems/{uuid_of_a}/Actions/ComputerSystem.Reset");
    assert!(posts.iter().all(|p| *p == own), "{posts:?}");
    assert_eq!(node_b.power_state().await.unwrap(), PowerState::On);
}

#[tokio::test]
async fn a_system_is_found_by_name_or_as_the_only_one() {
    let single = emulator("only-one", &[("node-a", true)], false);
    assert_eq!(
        bmc(endpoint(&single, None)).power_state().await.unwrap(),
        PowerState::On
    );
    drop(single);

    let two = emulator("two", &[("node-a", true), ("node-b", false)], false);
    // The emulator redirects a name to the system's UUID path; the client follows it.
    assert_eq!(
        bmc(endpoint(&two, Some("node-b")))
            .power_state()
            .await
            .unwrap(),
        PowerState::Off
    );
    match bmc(endpoint(&two, None)).power_state().await {
        Err(Error::AmbiguousSystem { count: 2, .. }) => {}
        other => panic!("two systems without an id: {other:?}"),
    }
    match bmc(endpoint(&two, Some("node-c")))
        .reset(ResetType::ForceOff)
        .await
    {
        Err(Error::UnknownSystem { system, .. }) => assert_eq!(system, "node-c"),
        other => panic!("an unknown system: {other:?}"),
    }
}

#[tokio::test]
async fn wrong_credentials_are_refused_and_nothing_is_reset() {
    let emulator = emulator("credentials", &[("node-a", true)], false);
    let mut wrong = endpoint(&emulator, Some("node-a"));
    wrong.password = "guess".to_string();
    let wrong = bmc(wrong);
    for result in [
        wrong.power_state().await.map(|_| ()),
        wrong.reset(ResetType::ForceOff).await,
    ] {
        match result {
            Err(error @ Error::Unauthorized { status: 401, .. }) => {
                assert!(!error.is_transient());
            }
            other => panic!("wrong password: {other:?}"),
        }
    }
    let sent: Vec<String> = emulator.requests().unwrap();
    assert!(!sent.is_empty(), "the emulator logged no request");
    assert!(
        sent.iter().all(|r| !r.starts_with("POST")),
        "a reset was sent with wrong credentials: {sent:?}"
    );
    let right = bmc(endpoint(&emulator, Some("node-a")));
    assert_eq!(right.power_state().await.unwrap(), PowerState::On);
}

#[tokio::test]
async fn a_bmc_that_refuses_the_power_off_says_why() {
    let emulator = emulator("refused", &[("node-a", true)], true);
    match bmc(endpoint(&emulator, Some("node-a")))
        .reset(ResetType::ForceOff)
        .await
    {
        Err(Error::Refused {
            status: 400,
            message,
            ..
        }) => assert!(message.contains("power off"), "{message}"),
        other => panic!("a refused power-off: {other:?}"),
    }
}

#[tokio::test]
async fn the_certificate_must_be_signed_by_the_given_ca_unless_told_otherwise() {
    let emulator = emulator("tls", &[("node-a", true)], false);
    let mut untrusted = endpoint(&emulator, Some("node-a"));
    untrusted.trust = ca_of(OTHER_CA);
    match bmc(untrusted).power_state().await {
        Err(Error::Tls { detail, .. }) => assert!(detail.contains("certificate"), "{detail}"),
        other => panic!("a certificate of another CA: {other:?}"),
    }
    let mut insecure = endpoint(&emulator, Some("node-a"));
    insecure.trust = Trust::InsecureSkipVerify;
    assert_eq!(bmc(insecure).power_state().await.unwrap(), PowerState::On);
}

#[tokio::test]
async fn a_bmc_that_does_not_answer_is_unreachable_within_the_timeout() {
    let emulator = emulator("unreachable", &[("node-a", true)], false);
    // Nothing listens: refused at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut refused = endpoint(&emulator, Some("node-a"));
    refused.address = format!("https://127.0.0.1:{closed_port}").parse().unwrap();
    match bmc(refused).power_state().await {
        Err(error @ Error::Unreachable { .. }) => assert!(error.is_transient()),
        other => panic!("a closed port: {other:?}"),
    }
    // A listener that accepts and never answers: the request's timeout ends it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut hanging = endpoint(&emulator, Some("node-a"));
    hanging.address = format!("https://127.0.0.1:{}", silent.local_addr().unwrap().port())
        .parse()
        .unwrap();
    hanging.timeout = Duration::from_secs(1);
    match bmc(hanging).reset(ResetType::ForceOff).await {
        Err(Error::Unreachable { detail, .. }) => assert!(detail.contains("no answer"), "{detail}"),
        other => panic!("a silent listener: {other:?}"),
    }
    drop(silent);
}

/// A CA that signs nothing the emulator serves.
const OTHER_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBeDCCAR2gAwIBAgIUQL3SgG3iJN3OhAEtSnKqlFcj2/EwCgYIKoZIzj0EAwIw
ETEPMA0GA1UEAwwGYm1jLWNhMB4XDTI2MTEyNjIyMjU0NFoXDTM2MTEyMzIyMjU0
NFowETEPMA0GA1UEAwwGYm1jLWNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE
vIeL1KS1nVqTUsrrfQCNy543JxB4gaClTSLULe/4T1U2YiiOZRqUOls806WNbGXR
ay1vkOyIXFv3rTxW59lsdKNTMFEwHQYDVR0OBBYEFBumXoXfxjTUK1tV6E2w8LiX
4F/aMB8GA1UdIwQYMBaAFBumXoXfxjTUK1tV6E2w8LiX4F/aMA8GA1UdEwEB/wQF
MAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhAOAHm7bBGzNqI3AEFsQFERdUZTpDqrEG
1kiSUb3ZgY3fAiEAuoyz0yBe3GZDkpbN4UFPKBI7ZD6ari+VlR2Sbcv6wHY=
-----END CERTIFICATE-----
";

fn ca_of(pem: &str) -> Trust {
    Trust::from_ca_pem(pem.as_bytes()).expect("a PEM CA")
}

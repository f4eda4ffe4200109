use std::collections::BTreeMap;

use super::*;

/// A self-signed certificate, as a BMC's `ca.crt` would hold it.
const PEM: &str = "-----BEGIN CERTIFICATE-----
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

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect()
}

fn base() -> Vec<(&'static str, &'static str)> {
    vec![
        ("address", "https://10.0.0.9:8443"),
        ("username", "podha"),
        ("password", "s3cret\n"),
        ("ca.crt", PEM),
    ]
}

fn without(key: &str) -> Vec<(&'static str, &'static str)> {
    base().into_iter().filter(|(k, _)| *k != key).collect()
}

fn with(pairs: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut all = base();
    all.retain(|(k, _)| !pairs.iter().any(|(p, _)| p == k));
    all.extend_from_slice(pairs);
    all
}

fn settings_error(pairs: &[(&str, &str)]) -> String {
    match Endpoint::from_secret_data(&data(pairs)) {
        Err(Error::Settings(message)) => message,
        other => panic!("expected a settings error, got {other:?}"),
    }
}

#[test]
fn a_secret_with_address_credentials_and_ca_is_an_endpoint() {
    let endpoint = Endpoint::from_secret_data(&data(&base())).unwrap();
    assert_eq!(endpoint.authority(), "10.0.0.9:8443");
    assert_eq!(endpoint.username, "podha");
    assert_eq!(
        endpoint.password, "s3cret",
        "a trailing newline is not the password's"
    );
    assert_eq!(endpoint.system, None);
    assert!(matches!(&endpoint.trust, Trust::Ca(certs) if certs.len() == 1));
    assert_eq!(endpoint.timeout, endpoint::DEFAULT_TIMEOUT);

    let named = Endpoint::from_secret_data(&data(&with(&[("systemId", "System.Embedded.1")])));
    assert_eq!(named.unwrap().system.as_deref(), Some("System.Embedded.1"));
}

#[test]
fn the_password_never_shows_in_debug_output() {
    let endpoint = Endpoint::from_secret_data(&data(&base())).unwrap();
    let shown = format!("{endpoint:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}

#[test]
fn missing_keys_are_named() {
    for key in ["address", "username", "password"] {
        let message = settings_error(&without(key));
        assert!(message.contains(key), "{key}: {message}");
    }
    let message = settings_error(&with(&[("username", "")]));
    assert!(message.contains("username"), "{message}");
}

#[test]
fn trust_must_be_given_one_way_only() {
    let insecure = Endpoint::from_secret_data(&data(&{
        let mut pairs = without("ca.crt");
        pairs.push(("insecureSkipVerify", "true"));
        pairs
    }))
    .unwrap();
    assert_eq!(insecure.trust, Trust::InsecureSkipVerify);

    assert!(settings_error(&without("ca.crt")).contains("ca.crt is missing"));
    assert!(settings_error(&with(&[("insecureSkipVerify", "true")])).contains("not both"));
    assert!(settings_error(&with(&[("insecureSkipVerify", "yes")])).contains("insecureSkipVerify"));
    assert!(settings_error(&with(&[("ca.crt", "not a certificate")])).contains("ca.crt"));
    let explicit_false =
        Endpoint::from_secret_data(&data(&with(&[("insecureSkipVerify", "false")])));
    assert!(matches!(explicit_false.unwrap().trust, Trust::Ca(_)));
}

#[test]
fn only_a_bare_https_address_is_taken() {
    for (address, why) in [
        ("http://10.0.0.9", "https://"),
        ("10.0.0.9", "https://"),
        ("https://admin:pw@10.0.0.9", "credentials"),
        ("https://10.0.0.9/redfish/v1", "without a path"),
        ("https://10.0.0.9/?x=1", "without a path"),
        ("https://", "URL"),
    ] {
        let message = settings_error(&with(&[("address", address)]));
        assert!(message.contains(why), "{address}: {message}");
    }
    // A refused value is never echoed (the message reaches events and logs): not a password
    // in the address, nor one pasted into another key.
    for (key, value) in [
        ("address", "https://root:s3cret@10.0.0.9"),
        ("address", "s3cret"),
        ("insecureSkipVerify", "s3cret"),
        ("systemId", "s3cret/x"),
    ] {
        let message = settings_error(&with(&[(key, value)]));
        assert!(!message.contains("s3cret"), "{key}: {message}");
        assert!(message.contains(key), "{key}: {message}");
    }
    let trailing = Endpoint::from_secret_data(&data(&with(&[("address", "https://bmc.example/")])));
    assert_eq!(trailing.unwrap().authority(), "bmc.example");
    let ipv6 = Endpoint::from_secret_data(&data(&with(&[("address", "https://[fd00::9]:443")])));
    assert_eq!(ipv6.unwrap().authority(), "[fd00::9]:443");
}

#[test]
fn a_system_id_is_one_path_segment() {
    for bad in ["../Managers/1", "1/Actions", "a b", "1?x", ".", ".."] {
        let message = settings_error(&with(&[("systemId", bad)]));
        assert!(message.contains("systemId"), "{bad}: {message}");
    }
}

#[test]
fn an_endpoint_made_in_code_is_checked_as_one_from_a_secret() {
    let made = Endpoint::new(
        "https://10.0.0.9",
        Some("..".to_string()),
        "podha".to_string(),
        "pw".to_string(),
        Trust::InsecureSkipVerify,
    );
    assert!(matches!(made, Err(Error::Settings(m)) if m.contains("systemId")));
}

#[test]
fn only_off_is_off() {
    assert!(PowerState::parse(Some("Off")).is_off());
    for value in [
        Some("On"),
        Some("PoweringOff"),
        Some("Paused"),
        Some("off"),
        None,
    ] {
        let state = PowerState::parse(value);
        assert!(!state.is_off(), "{value:?} taken for off");
    }
    assert_eq!(PowerState::parse(None).to_string(), "null");
    assert_eq!(
        PowerState::parse(Some("PoweringOff")),
        PowerState::PoweringOff
    );
}

#[test]
fn errors_say_whether_asking_again_can_help() {
    let address = "bmc:443".to_string();
    let transient = [
        Error::Unreachable {
            address: address.clone(),
            detail: "connection refused".into(),
        },
        Error::Refused {
            address: address.clone(),
            status: 503,
            message: "busy".into(),
        },
        Error::Refused {
            address: address.clone(),
            status: 429,
            message: "slow down".into(),
        },
    ];
    for error in &transient {
        assert!(error.is_transient(), "{error}");
    }
    let lasting = [
        Error::Unauthorized {
            address: address.clone(),
            status: 401,
        },
        Error::UnknownSystem {
            address: address.clone(),
            system: "9".into(),
        },
        Error::Tls {
            address: address.clone(),
            detail: "unknown issuer".into(),
        },
        Error::Refused {
            address,
            status: 400,
            message: "bad request".into(),
        },
    ];
    for error in &lasting {
        assert!(!error.is_transient(), "{error}");
    }
    assert_eq!(lasting[0].as_str(), "unauthorized");
}

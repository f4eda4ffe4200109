use super::*;

fn key() -> Identity {
    Identity::generate().expect("key")
}

#[test]
fn a_word_verifies_under_its_speakers_key_alone() {
    let (agent, other) = (key(), key());
    let answer = PeerAnswer::signed(&agent, "n1", Some(Duration::from_millis(1500)), "nonce-1");
    assert!(
        agent
            .public()
            .verifies(&answer.word("nonce-1"), &answer.signature)
    );
    assert!(
        !other
            .public()
            .verifies(&answer.word("nonce-1"), &answer.signature),
        "another node's key"
    );
    assert!(
        !agent
            .public()
            .verifies(&answer.word("nonce-2"), &answer.signature),
        "an answer to another question"
    );
    let mut changed = answer.clone();
    changed.heard_ago_ms = Some(1);
    assert!(
        !agent
            .public()
            .verifies(&changed.word("nonce-1"), &changed.signature),
        "a changed field"
    );
    let mut moved = answer.clone();
    moved.node = "n2".into();
    assert!(
        !agent
            .public()
            .verifies(&moved.word("nonce-1"), &moved.signature)
    );
    for garbage in ["", "not base64!", &URL_SAFE_NO_PAD.encode([0u8; 64])] {
        assert!(!agent.public().verifies(&answer.word("nonce-1"), garbage));
    }
}

#[test]
fn a_signature_covers_its_kind_of_word() {
    let speaker = key();
    // The same strings in two kinds of word: a signature of one is none of the other.
    let ask = Word::PeerAsk {
        from: "n1",
        to: "n2",
        nonce: "x",
    };
    let answer = Word::PeerAnswer {
        node: "n1",
        heard_ago_ms: None,
        nonce: "x",
    };
    let signature = speaker.sign(&ask);
    assert!(speaker.public().verifies(&ask, &signature));
    assert!(!speaker.public().verifies(&answer, &signature));
    // A field cannot run into the next one.
    let split = Word::PeerAsk {
        from: "n1\",\"n2",
        to: "",
        nonce: "x",
    };
    assert!(!speaker.public().verifies(&split, &signature));
}

#[test]
fn a_heartbeat_travels_as_a_query_and_verifies_as_sent() {
    let leader = key();
    for heard_ago in [
        None,
        Some(Duration::ZERO),
        Some(Duration::from_millis(2345)),
    ] {
        let sent = HeartbeatQuery::signed(&leader, "n1", heard_ago, "challenge-1");
        let uri: axum::http::Uri = sent.path_and_query().parse().expect("uri");
        assert_eq!(uri.path(), HEARTBEAT_PATH);
        let axum::extract::Query(read) =
            axum::extract::Query::<HeartbeatQuery>::try_from_uri(&uri).expect("query");
        assert_eq!(read, sent);
        assert_eq!(read.heard_ago(), heard_ago);
        assert!(leader.public().verifies(&read.word("n1"), &read.signature));
        assert!(
            !leader.public().verifies(&read.word("n2"), &read.signature),
            "a heartbeat for one node is none for another"
        );
    }
    // A probe without any field reads as unsigned, not as an error.
    let uri: axum::http::Uri = "/heartbeat?heardMs=0".parse().expect("uri");
    let axum::extract::Query(bare) =
        axum::extract::Query::<HeartbeatQuery>::try_from_uri(&uri).expect("query");
    assert!(bare.signature.is_empty());
}

#[test]
fn a_peer_question_travels_as_a_query_and_verifies_as_sent() {
    let asker = key();
    let sent = PeerQuery::signed(&asker, "n1", "n2");
    let uri: axum::http::Uri = sent.path_and_query().parse().expect("uri");
    let axum::extract::Query(read) =
        axum::extract::Query::<PeerQuery>::try_from_uri(&uri).expect("query");
    assert_eq!(read, sent);
    assert!(asker.public().verifies(&read.word("n2"), &read.signature));
    assert!(!asker.public().verifies(&read.word("n3"), &read.signature));
    assert_ne!(
        PeerQuery::signed(&asker, "n1", "n2").nonce,
        sent.nonce,
        "every question has a nonce of its own"
    );
}

#[test]
fn keys_keep_their_form() {
    let identity = key();
    let public = identity.public();
    assert_eq!(PublicKey::parse(&public.encode()), Some(public));
    assert_eq!(public.encode().len(), 43, "32 bytes, unpadded base64url");
    assert_eq!(PublicKey::parse(""), None);
    assert_eq!(PublicKey::parse("too-short"), None);
    let again = Identity::from_pkcs8(identity.pkcs8()).expect("kept key");
    assert_eq!(again.public(), public);
    assert!(Identity::from_pkcs8(b"not a key").is_err());
    assert_eq!(AGENT_KEY_ANNOTATION, "podha.io/agent-key");
    assert_eq!(LEADER_KEY_ANNOTATION, "podha.io/leader-key");
}

#[test]
fn the_answers_json_keeps_its_field_names() {
    let mut answer = HeartbeatAnswer {
        node: "n1".into(),
        heard: true,
        heard_ago_ms: Some(Some(1500)),
        held: None,
        challenge: "c".into(),
        signature: "s".into(),
    };
    assert_eq!(
        serde_json::to_value(&answer).expect("json"),
        serde_json::json!({
            "node": "n1", "heard": true, "heardAgoMs": 1500, "challenge": "c", "signature": "s"
        })
    );
    answer.heard = false;
    answer.heard_ago_ms = Some(None);
    assert_eq!(
        serde_json::to_value(&answer).expect("json"),
        serde_json::json!({
            "node": "n1", "heard": false, "heardAgoMs": null, "challenge": "c", "signature": "s"
        })
    );
    let peer = PeerAnswer {
        node: "n1".into(),
        heard_ago_ms: Some(5),
        signature: "s".into(),
    };
    assert_eq!(
        serde_json::to_value(&peer).expect("json"),
        serde_json::json!({"node": "n1", "heardAgoMs": 5, "signature": "s"})
    );
}

/// An answer says how long ago the agent was last heard, or that it never was (`null`); an
/// agent from before `heardAgoMs` leaves it out, and its answer still verifies as it signed
/// it. An answer that carries it cannot pass for an older agent's by losing it.
#[test]
fn a_heartbeat_answer_says_since_when_the_agent_is_heard_and_keeps_saying_it() {
    let agent = key();
    for heard_ago in [
        None,
        Some(Duration::ZERO),
        Some(Duration::from_millis(30_250)),
    ] {
        let sent = HeartbeatAnswer::signed(&agent, "n1", heard_ago, None, "nonce-1", "c");
        assert_eq!(sent.heard, heard_ago.is_some());
        let read: HeartbeatAnswer =
            serde_json::from_slice(&serde_json::to_vec(&sent).expect("json")).expect("answer");
        assert_eq!(read, sent);
        assert_eq!(read.heard_ago(), Some(heard_ago));
        assert!(
            agent
                .public()
                .verifies(&read.word("nonce-1"), &read.signature)
        );
        let mut dropped = read.clone();
        dropped.heard_ago_ms = None;
        assert!(
            !agent
                .public()
                .verifies(&dropped.word("nonce-1"), &dropped.signature),
            "an answer that lost heardAgoMs"
        );
        let mut changed = read.clone();
        changed.heard_ago_ms = Some(Some(1));
        assert!(
            !agent
                .public()
                .verifies(&changed.word("nonce-1"), &changed.signature),
            "another heardAgoMs"
        );
    }
    // An older agent's answer, signed without the field.
    let older: HeartbeatAnswer = serde_json::from_value(serde_json::json!({
        "node": "n1", "heard": true, "challenge": "c", "signature": ""
    }))
    .expect("answer");
    assert_eq!(older.heard_ago(), None);
    let signature = agent.sign(&Word::HeartbeatAnswer {
        node: "n1",
        heard: true,
        heard_ago_ms: None,
        held: None,
        nonce: "nonce-1",
        challenge: "c",
    });
    assert!(agent.public().verifies(&older.word("nonce-1"), &signature));
    let mut claimed = older.clone();
    claimed.heard_ago_ms = Some(Some(0));
    assert!(
        !agent
            .public()
            .verifies(&claimed.word("nonce-1"), &signature),
        "an older agent's answer given a heardAgoMs"
    );
}

/// A heartbeat may say whether podha holds the node, in which leadership term it is sent and
/// whether it counts from the agent's renewals, and the answer whether the agent takes it as
/// held: each a word of its own kind, so none can be dropped, added or turned.
#[test]
fn hold_term_renewals_and_held_are_signed_and_cannot_be_dropped_added_or_turned() {
    let leader = key();
    let holds = [None, Some(false), Some(true)];
    let terms = [None, Some(0), Some(7)];
    let renewals = [None, Some(false), Some(true)];
    let every: Vec<Said> = holds
        .iter()
        .flat_map(|&hold| terms.iter().map(move |&term| (hold, term)))
        .flat_map(|(hold, term)| {
            renewals.iter().map(move |&renewals| Said {
                hold,
                term,
                renewals,
            })
        })
        .collect();
    for &said in &every {
        let sent = HeartbeatQuery::signed_as(&leader, "n1", None, said, "c");
        let uri: axum::http::Uri = sent.path_and_query().parse().expect("uri");
        let axum::extract::Query(read) =
            axum::extract::Query::<HeartbeatQuery>::try_from_uri(&uri).expect("query");
        assert_eq!(
            (read.hold, read.term, read.renewals),
            (said.hold, said.term, said.renewals)
        );
        assert!(leader.public().verifies(&read.word("n1"), &read.signature));
        for &other in &every {
            let mut turned = read.clone();
            (turned.hold, turned.term, turned.renewals) = (other.hold, other.term, other.renewals);
            assert_eq!(
                leader
                    .public()
                    .verifies(&turned.word("n1"), &turned.signature),
                other == said,
                "a heartbeat signed as {said:?} read as {other:?}"
            );
        }
    }
    assert_eq!(
        HeartbeatQuery::signed(&leader, "n1", None, "c").hold,
        None,
        "a heartbeat that says nothing of holds"
    );
    let agent = key();
    for held in [None, Some(false), Some(true)] {
        let sent =
            HeartbeatAnswer::signed(&agent, "n1", Some(Duration::ZERO), held, "nonce-1", "c");
        let read: HeartbeatAnswer =
            serde_json::from_slice(&serde_json::to_vec(&sent).expect("json")).expect("answer");
        assert_eq!(read.held, held);
        for other in [None, Some(false), Some(true)] {
            let mut turned = read.clone();
            turned.held = other;
            assert_eq!(
                agent
                    .public()
                    .verifies(&turned.word("nonce-1"), &turned.signature),
                other == held,
                "an answer signed with held {held:?} read with {other:?}"
            );
        }
    }
}

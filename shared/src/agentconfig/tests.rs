//! The rules' and the document's tests.

use super::*;

#[test]
fn urls_must_be_plain_https() {
    assert!(check_server_url("https://join.example.com:8443").is_ok());
    assert_eq!(
        check_server_url("http://join.example.com"),
        Err("must start with https://")
    );
    assert_eq!(
        check_server_url("https://u:p@join.example.com"),
        Err("must not carry credentials")
    );
    assert_eq!(
        check_server_url("https://join.example.com/?x=1"),
        Err("must not have a query")
    );
    assert_eq!(check_server_url("not a url"), Err("not a URL"));
}

#[test]
fn cluster_names_are_dns_like() {
    assert!(is_valid_cluster_name("prod-eu-1.a_b"));
    assert!(!is_valid_cluster_name(""));
    assert!(!is_valid_cluster_name("Prod"));
    assert!(!is_valid_cluster_name(&"a".repeat(64)));
}

#[test]
fn a_ca_bundle_needs_a_certificate() {
    assert_eq!(
        parse_ca_pem("nothing here"),
        Err("no CERTIFICATE block".into())
    );
}

fn full() -> Document {
    Document {
        server_url: Some("https://join.example.com:8443".into()),
        server_ca: Some("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into()),
        server_ca_sha256: Some("ab".repeat(32)),
        cluster_name: Some("prod-eu-1".into()),
        options: Options {
            deadline: Some("10m".into()),
            state_dir: Some("/var/lib/autonode".into()),
            https_proxy: Some(String::new()),
            no_proxy: Some(".internal,10.0.0.0/8".into()),
            imds_endpoint_mode: Some("IPv6".into()),
        },
    }
}

#[test]
fn the_writer_has_one_spelling_per_value() {
    let doc = Document {
        server_url: Some("https://a".into()),
        cluster_name: Some("c".into()),
        options: Options {
            deadline: Some("90s".into()),
            ..Options::default()
        },
        ..Document::default()
    };
    let expected =
        "server-url = \"https://a\"\ncluster-name = \"c\"\n\n[options]\ndeadline = \"90s\"\n";
    assert_eq!(doc.to_toml(), expected);
    assert_eq!(Document::default().to_toml(), "");
    assert_eq!(document::string("a\"b\\c\t"), "\"a\\\"b\\\\c\\u0009\"");
    assert_eq!(
        document::string("x\n\"y\r\n"),
        "\"\"\"\nx\n\\\"y\\u000D\n\"\"\""
    );
}

#[test]
fn every_written_document_parses_back_to_itself() {
    let awkward = [
        "",
        "plain",
        "quote \" and backslash \\ and tab \t",
        "\"\"\" three quotes",
        "ends in a quote\"",
        "ends in a backslash\\",
        "line\nbreaks\n",
        "\nleading break",
        "\n\n",
        "crlf\r\nline",
        "unicode: é ✓ \u{7f} \u{1b}",
        "multi\nline ending in quote\"",
        "multi\nline ending in backslash\\",
    ];
    let mut docs = vec![Document::default(), full()];
    for value in awkward {
        let mut doc = full();
        doc.server_ca = Some(value.into());
        doc.cluster_name = Some(value.into());
        doc.options.no_proxy = Some(value.into());
        docs.push(doc);
    }
    let mut only_options = Document::default();
    only_options.options.state_dir = Some("/s".into());
    docs.push(only_options);
    for doc in docs {
        let text = doc.to_toml();
        let parsed = Document::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(parsed, doc, "{text}");
    }
}

#[test]
fn unknown_keys_are_refused_by_name() {
    let err = Document::parse("server-url = \"https://x\"\ntoken = \"s\"\n").unwrap_err();
    assert!(err.to_string().contains("token"), "{err}");
    let err = Document::parse("[options]\ndeadlin = \"5m\"\n").unwrap_err();
    assert!(err.to_string().contains("deadlin"), "{err}");
}

#[test]
fn an_upper_layer_wins_key_by_key_and_trust_as_one() {
    let lower = full();
    let upper = Document {
        server_url: Some("https://b".into()),
        server_ca: Some("pem".into()),
        options: Options {
            deadline: Some("1m".into()),
            ..Options::default()
        },
        ..Document::default()
    };
    let merged = lower.clone().overlay(upper);
    assert_eq!(merged.server_url.as_deref(), Some("https://b"));
    assert_eq!(merged.server_ca.as_deref(), Some("pem"));
    assert_eq!(merged.server_ca_sha256, None, "trust replaced as one");
    assert_eq!(merged.cluster_name, lower.cluster_name);
    assert_eq!(merged.options.deadline.as_deref(), Some("1m"));
    assert_eq!(merged.options.no_proxy, lower.options.no_proxy);
    assert_eq!(lower.clone().overlay(Document::default()), lower);
}

#[test]
fn deadlines_parse_within_the_range_and_print_one_way() {
    assert_eq!(parse_deadline("90"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_deadline(" 10m "), Ok(Duration::from_secs(600)));
    assert_eq!(parse_deadline("0s"), Err(DeadlineError::Zero));
    assert_eq!(parse_deadline("16m"), Err(DeadlineError::TooLong));
    assert_eq!(parse_deadline("1h"), Err(DeadlineError::TooLong));
    assert_eq!(parse_deadline("5d"), Err(DeadlineError::Unit));
    assert_eq!(parse_deadline("m"), Err(DeadlineError::Syntax));
    assert_eq!(deadline_text(Duration::from_secs(90)), "90s");
    assert_eq!(deadline_text(Duration::from_secs(600)), "10m");
    assert_eq!(deadline_text(Duration::from_secs(3600)), "1h");
    // Every deadline in the range prints as text that parses back to it.
    for secs in 1..=MAX_DEADLINE.as_secs() {
        let deadline = Duration::from_secs(secs);
        assert_eq!(parse_deadline(&deadline_text(deadline)), Ok(deadline));
    }
}

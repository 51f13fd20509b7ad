//! The metric and label names a PromQL expression asks for (and the label
//! values its matchers compare with), and the ones an OpenMetrics scrape
//! has, so a test can check that alerting rules and dashboards ask only for
//! series the server really exports.
//!
//! The extractor is deliberately small and strict: it reads the subset of
//! PromQL that rules and dashboards use (selectors, functions, aggregations
//! with `by`/`without`, binary operators with `on`/`ignoring`/`group_*`)
//! and fails on what it does not understand instead of guessing.

use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// What cannot be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("unterminated string in {0:?}")]
    UnterminatedString(String),
    #[error("unbalanced brackets in {0:?}")]
    Unbalanced(String),
    #[error("selector without a metric name in {0:?} (not supported)")]
    NamelessSelector(String),
    #[error("unexpected {found:?} in a label list or matcher of {expr:?}")]
    Unexpected { found: String, expr: String },
    #[error("malformed scrape line {0:?}")]
    ScrapeLine(String),
    #[error("unknown matcher operator {op:?} in {expr:?}")]
    Operator { op: String, expr: String },
}

/// How a label matcher compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MatchOp {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `=~`
    Regex,
    /// `!~`
    NotRegex,
}

/// One label matcher of a selector, `metric{label<op>"value"}`, its value
/// unquoted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Matcher {
    pub metric: String,
    pub label: String,
    pub op: MatchOp,
    pub value: String,
}

/// The names one or more expressions use.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Names {
    /// Each metric, with the label names its own selectors match on.
    pub metrics: BTreeMap<String, BTreeSet<String>>,
    /// Label names in `by`, `without`, `on`, `ignoring` and `group_*` lists.
    pub grouping: BTreeSet<String>,
    /// Every label matcher, with the value it compares with.
    pub matchers: BTreeSet<Matcher>,
}

impl Names {
    /// Adds what `other` uses.
    pub fn merge(&mut self, other: Names) {
        for (metric, labels) in other.metrics {
            self.metrics.entry(metric).or_default().extend(labels);
        }
        self.grouping.extend(other.grouping);
        self.matchers.extend(other.matchers);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    /// A string, number, duration range, Grafana `$variable` or operator:
    /// nothing that names a series.
    Other(String),
    Open(char),
    Close(char),
    Comma,
}

/// Keywords that are not metric names wherever they stand.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "inf", "nan", "atan2",
];
/// Keywords followed by a list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Splits `expr` into tokens; `[...]` (ranges, subqueries, Grafana's
/// `$__rate_interval`) becomes one [`Token::Other`].
fn tokens(expr: &str) -> Result<Vec<Token>, ParseError> {
    let chars: Vec<char> = expr.chars().collect();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        i += 1;
        match c {
            c if c.is_whitespace() => {}
            '"' | '\'' | '`' => {
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' && c != '`' { 2 } else { 1 };
                }
                if i >= chars.len() {
                    return Err(ParseError::UnterminatedString(expr.into()));
                }
                i += 1;
                out.push(Token::Other(chars[start..i].iter().collect()));
            }
            '[' => {
                let close = chars[i..].iter().position(|&c| c == ']');
                let close = close.ok_or_else(|| ParseError::Unbalanced(expr.into()))?;
                i += close + 1;
                out.push(Token::Other(chars[start..i].iter().collect()));
            }
            '(' | '{' => out.push(Token::Open(c)),
            ')' | '}' => out.push(Token::Close(c)),
            ',' => out.push(Token::Comma),
            c if ident_start(c) => {
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
                out.push(Token::Ident(chars[start..i].iter().collect()));
            }
            // A number (or its exponent), or a `$variable`: one word.
            c if c.is_ascii_digit() || c == '.' || c == '$' => {
                while i < chars.len() && (ident_char(chars[i]) || chars[i] == '.') {
                    i += 1;
                }
                out.push(Token::Other(chars[start..i].iter().collect()));
            }
            other => out.push(Token::Other(other.to_string())),
        }
    }
    Ok(out)
}

/// The metric and label names `expr` uses.
pub fn names(expr: &str) -> Result<Names, ParseError> {
    let tokens = tokens(expr)?;
    let mut names = Names::default();
    let mut i = 0;
    while i < tokens.len() {
        let next = tokens.get(i + 1);
        match &tokens[i] {
            Token::Ident(word) if one_of(word, LABEL_LISTS) && next == Some(&Token::Open('(')) => {
                i = label_list(&tokens, i + 2, &mut names.grouping, expr)?;
            }
            // `group_left` without a list, `and`, `bool`, ...
            Token::Ident(word) if one_of(word, KEYWORDS) || one_of(word, LABEL_LISTS) => {}
            // A function, or an aggregation with its grouping first.
            Token::Ident(_) if next == Some(&Token::Open('(')) => {}
            Token::Ident(_) if matches!(next, Some(Token::Ident(w)) if one_of(w, &["by", "without"])) =>
                {}
            Token::Ident(metric) => {
                names.metrics.entry(metric.clone()).or_default();
                if next == Some(&Token::Open('{')) {
                    i = matchers(&tokens, i + 2, metric, &mut names, expr)?;
                }
            }
            Token::Open('{') => return Err(ParseError::NamelessSelector(expr.into())),
            _ => {}
        }
        i += 1;
    }
    Ok(names)
}

/// Whether `word` is one of the (lowercase) keywords `list`: PromQL's
/// keywords are not case-sensitive.
fn one_of(word: &str, list: &[&str]) -> bool {
    list.iter().any(|k| k.eq_ignore_ascii_case(word))
}

/// Reads `a, b)` from `i`, adding the names; returns the index of `)`.
fn label_list(
    tokens: &[Token],
    mut i: usize,
    into: &mut BTreeSet<String>,
    expr: &str,
) -> Result<usize, ParseError> {
    loop {
        match tokens.get(i) {
            Some(Token::Ident(label)) => {
                into.insert(label.clone());
            }
            Some(Token::Comma) => {}
            Some(Token::Close(')')) => return Ok(i),
            Some(other) => return Err(unexpected(other, expr)),
            None => return Err(ParseError::Unbalanced(expr.into())),
        }
        i += 1;
    }
}

/// Reads `a="x", b!~"y"}` from `i`, adding the label names and matchers
/// of `metric`; returns the index of `}`.
fn matchers(
    tokens: &[Token],
    mut i: usize,
    metric: &str,
    names: &mut Names,
    expr: &str,
) -> Result<usize, ParseError> {
    loop {
        match tokens.get(i) {
            Some(Token::Close('}')) => return Ok(i),
            Some(Token::Comma) => i += 1,
            Some(Token::Ident(label)) => {
                names
                    .metrics
                    .entry(metric.to_string())
                    .or_default()
                    .insert(label.clone());
                i += 1;
                // The operator (`=`, `!=`, `=~`, `!~`: one or two tokens),
                // then the quoted value.
                let mut op = String::new();
                let value = loop {
                    match tokens.get(i) {
                        Some(Token::Other(word)) if word.starts_with(['"', '\'', '`']) => {
                            i += 1;
                            break unquote(word);
                        }
                        Some(Token::Other(part)) => op.push_str(part),
                        Some(other) => return Err(unexpected(other, expr)),
                        None => return Err(ParseError::Unbalanced(expr.into())),
                    }
                    i += 1;
                };
                let op = match op.as_str() {
                    "=" => MatchOp::Equal,
                    "!=" => MatchOp::NotEqual,
                    "=~" => MatchOp::Regex,
                    "!~" => MatchOp::NotRegex,
                    _ => {
                        return Err(ParseError::Operator {
                            op,
                            expr: expr.into(),
                        })
                    }
                };
                names.matchers.insert(Matcher {
                    metric: metric.to_string(),
                    label: label.clone(),
                    op,
                    value,
                });
            }
            Some(other) => return Err(unexpected(other, expr)),
            None => return Err(ParseError::Unbalanced(expr.into())),
        }
    }
}

/// A PromQL string literal's value: backquoted ones are raw, the others
/// have their backslash escapes undone (enough for label values:
/// `\\`, `\"`, `\'`, `\n`, `\t`).
fn unquote(literal: &str) -> String {
    // The tokenizer keeps both quotes.
    let inner = literal
        .get(1..literal.len().saturating_sub(1))
        .unwrap_or_default();
    if literal.starts_with('`') {
        return inner.to_string();
    }
    unescape(inner)
}

/// `text` with its backslash escapes undone.
fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

fn unexpected(token: &Token, expr: &str) -> ParseError {
    ParseError::Unexpected {
        found: format!("{token:?}"),
        expr: expr.into(),
    }
}

/// What one scrape of `/metrics` holds.
#[derive(Debug, Default, Clone)]
pub struct Scrape {
    /// Each family's type, from its `# TYPE` line.
    pub families: BTreeMap<String, String>,
    /// Each sample name, with the label names its samples carry.
    pub samples: BTreeMap<String, BTreeSet<String>>,
    /// Each (sample name, label name), with the values its samples carry.
    pub values: BTreeMap<(String, String), BTreeSet<String>>,
}

/// Series the server exports only once a fleet event happened (a rollout
/// put back, a node smaller than its NodeClaim): a scrape after a join has
/// none of them. The rules and dashboard queries that use them are checked
/// against the scrapes of the tests that cause those events (`rollout::`,
/// `capacity::`), through [`rules_missing_from`]; the alerts test checks
/// every other rule and query.
pub const AFTER_FLEET_EVENTS: &[&str] = &[
    "autonode_rollouts_reverted_total",
    "autonode_capacity_shortfalls_total",
];

/// The alerting rules' file, as the chart ships it, from the repository.
pub const RULES_FILE: &str = "packaging/helm/autonode-server/files/prometheus-rules.yaml";

/// The Grafana dashboard, as the chart ships it, from the repository.
pub const DASHBOARD_FILE: &str = "packaging/helm/autonode-server/files/grafana-dashboard.json";

/// [`RULES_FILE`]'s text.
pub fn read_rules() -> anyhow::Result<String> {
    read_repo_file(RULES_FILE)
}

/// A file of the repository, by its path there.
fn read_repo_file(relative: &str) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// Every query (`expr`) of a Grafana dashboard's JSON text.
pub fn dashboard_exprs(dashboard: &str) -> anyhow::Result<Vec<String>> {
    let dashboard: serde_json::Value = serde_json::from_str(dashboard)?;
    let mut exprs = Vec::new();
    collect_strings(&dashboard, "expr", &mut exprs);
    Ok(exprs)
}

/// Every string value under `key` anywhere in `value`.
pub fn collect_strings(value: &serde_json::Value, key: &str, into: &mut Vec<String>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match v.as_str() {
                    Some(s) if k == key => into.push(s.to_string()),
                    _ => collect_strings(v, key, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_strings(v, key, into)),
        _ => {}
    }
}

/// Every rule's `expr` in a Prometheus rule file's text.
pub fn rule_exprs(rules: &str) -> anyhow::Result<Vec<String>> {
    use anyhow::Context as _;
    let file: serde_yaml::Value = serde_yaml::from_str(rules)?;
    let groups = file["groups"].as_sequence().context("no groups")?;
    let rules = groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten());
    rules
        .map(|r| {
            r["expr"]
                .as_str()
                .map(String::from)
                .context("a rule without expr")
        })
        .collect()
}

/// What `scrape_text` lacks of the names and matcher values in the rules
/// (of [`RULES_FILE`]'s text `rules`) and the dashboard's queries
/// ([`DASHBOARD_FILE`]) that use `metric`, one line each; an error when no
/// rule or no query uses it, so a renamed metric cannot pass by being asked
/// for by none.
pub fn rules_missing_from(
    scrape_text: &str,
    rules: &str,
    metric: &str,
) -> anyhow::Result<Vec<String>> {
    let scrape = Scrape::parse(scrape_text)?;
    let dashboard = dashboard_exprs(&read_repo_file(DASHBOARD_FILE)?)?;
    let mut missing = Vec::new();
    for (what, exprs) in [("rule", rule_exprs(rules)?), ("dashboard query", dashboard)] {
        let mut using = 0;
        for expr in exprs {
            let used = names(&expr)?;
            if !used.metrics.contains_key(metric) {
                continue;
            }
            using += 1;
            let mut lines = scrape.missing(&used, &[]);
            lines.extend(scrape.missing_values(&used, &[]));
            missing.extend(
                lines
                    .into_iter()
                    .map(|l| format!("{l}\n    in {what} {expr}")),
            );
        }
        anyhow::ensure!(using > 0, "no {what} uses {metric}");
    }
    Ok(missing)
}

/// The sample suffixes an OpenMetrics family of `kind` has, as Prometheus
/// stores them (`_created` is left out: nothing here asks for it).
fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total"],
        "histogram" => &["_bucket", "_sum", "_count"],
        "summary" => &["", "_sum", "_count"],
        "info" => &["_info"],
        _ => &[""],
    }
}

impl Scrape {
    /// Reads an OpenMetrics (or Prometheus text) exposition.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let mut scrape = Scrape::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                    return Err(ParseError::ScrapeLine(line.into()));
                };
                scrape.families.insert(name.into(), kind.into());
            } else if !line.starts_with('#') {
                let (name, labels) = sample(line)?;
                let names = scrape.samples.entry(name.clone()).or_default();
                names.extend(labels.iter().map(|(label, _)| label.clone()));
                for (label, value) in labels {
                    let key = (name.clone(), label);
                    scrape.values.entry(key).or_default().insert(value);
                }
            }
        }
        Ok(scrape)
    }

    /// The series names Prometheus stores for this scrape's families:
    /// `_total` for a counter, `_bucket`, `_sum` and `_count` for a
    /// histogram, the name itself for a gauge.
    pub fn stored_names(&self) -> BTreeSet<String> {
        self.families
            .iter()
            .flat_map(|(family, kind)| suffixes(kind).iter().map(move |s| format!("{family}{s}")))
            .collect()
    }

    /// What in `names` this scrape does not have, one line each; empty
    /// when everything is there. `target_labels` are the labels Prometheus
    /// adds when it scrapes (`instance`, `job`): accepted on any metric.
    pub fn missing(&self, names: &Names, target_labels: &[&str]) -> Vec<String> {
        let stored = self.stored_names();
        let mut missing = Vec::new();
        let mut all_labels: BTreeSet<&str> = target_labels.iter().copied().collect();
        for (metric, labels) in &names.metrics {
            if !stored.contains(metric) {
                missing.push(format!("metric {metric}: not exported"));
                continue;
            }
            let Some(present) = self.samples.get(metric) else {
                missing.push(format!("metric {metric}: exported but no sample scraped"));
                continue;
            };
            all_labels.extend(present.iter().map(String::as_str));
            for label in labels {
                if !present.contains(label) && !target_labels.contains(&label.as_str()) {
                    missing.push(format!("label {label} on {metric}: not on any sample"));
                }
            }
        }
        for label in &names.grouping {
            if !all_labels.contains(label.as_str()) {
                missing.push(format!(
                    "grouping label {label}: on no sample of the metrics used"
                ));
            }
        }
        missing
    }

    /// The matchers of `names` whose value this scrape never has, one line
    /// each: an `=` or `!=` value no sample carries (a renamed value leaves
    /// a rule that never matches, or excludes nothing), a regex (`=~`,
    /// `!~`, anchored as PromQL anchors it) that matches no value. Matchers
    /// on `target_labels`, on labels no sample has (which [`Scrape::missing`]
    /// reports) and `=""` / `!=""` (absence) are not checked.
    pub fn missing_values(&self, names: &Names, target_labels: &[&str]) -> Vec<String> {
        let mut missing = Vec::new();
        for m in &names.matchers {
            let key = (m.metric.clone(), m.label.clone());
            let Some(values) = self.values.get(&key) else {
                continue;
            };
            if target_labels.contains(&m.label.as_str()) || m.value.is_empty() {
                continue;
            }
            let found = match m.op {
                MatchOp::Equal | MatchOp::NotEqual => values.contains(&m.value),
                MatchOp::Regex | MatchOp::NotRegex => {
                    match regex_lite::Regex::new(&format!("^(?:{})$", m.value)) {
                        Ok(re) => values.iter().any(|v| re.is_match(v)),
                        Err(e) => {
                            missing.push(format!("{m:?}: not a regex: {e}"));
                            continue;
                        }
                    }
                }
            };
            if !found {
                missing.push(format!(
                    "value {:?} of {} on {} ({:?}): on no sample (scraped: {values:?})",
                    m.value, m.label, m.metric, m.op
                ));
            }
        }
        missing
    }
}

/// A sample line's name and labels (name, unescaped value).
fn sample(line: &str) -> Result<(String, Vec<(String, String)>), ParseError> {
    let bad = || ParseError::ScrapeLine(line.into());
    let end = line.find(['{', ' ']).ok_or_else(bad)?;
    let name = line[..end].to_string();
    if !line[end..].starts_with('{') {
        return Ok((name, Vec::new()));
    }
    let (mut labels, mut rest) = (Vec::new(), &line[end + 1..]);
    loop {
        rest = rest.trim_start_matches(',');
        if rest.starts_with('}') {
            return Ok((name, labels));
        }
        let eq = rest.find("=\"").ok_or_else(bad)?;
        let (value, after) = split_quoted(&rest[eq + 1..]).ok_or_else(bad)?;
        labels.push((rest[..eq].to_string(), unescape(value)));
        rest = after;
    }
}

/// The quoted string `rest` starts with (still escaped), and what follows.
fn split_quoted(rest: &str) -> Option<(&str, &str)> {
    let mut chars = rest.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '"' => return Some((&rest[1..i], &rest[i + 1..])),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(expr: &str) -> Vec<String> {
        names(expr).unwrap().metrics.into_keys().collect()
    }

    #[test]
    fn functions_aggregations_and_keywords_are_not_metrics() {
        let expr = r#"histogram_quantile(0.99, sum by (le, step) (rate(a_bucket{x="1"}[$__rate_interval])))
            / on (step) group_left sum without (y) (b_total offset 5m) > bool 0.5 or vector(0)"#;
        let got = names(expr).unwrap();
        assert_eq!(
            got.metrics.keys().collect::<Vec<_>>(),
            ["a_bucket", "b_total"]
        );
        assert_eq!(got.metrics["a_bucket"], BTreeSet::from(["x".to_string()]));
        assert_eq!(got.grouping, ["le", "step", "y"].map(String::from).into());
    }

    #[test]
    fn aggregations_with_grouping_after_and_bare_names() {
        assert_eq!(metrics("sum(rate(c_total[5m])) by (reason)"), ["c_total"]);
        assert_eq!(metrics("g == 0"), ["g"]);
        assert_eq!(metrics("(sum(g) or vector(0)) < 1"), ["g"]);
        assert_eq!(metrics("max(g)"), ["g"]);
        assert_eq!(metrics("1e3 * h:ratio"), ["h:ratio"]);
        assert_eq!(metrics("SUM BY (le) (x) AND y"), ["x", "y"]);
    }

    #[test]
    fn matchers_give_label_names_and_values_are_not_names() {
        let got =
            names(r#"j{result="refused", reason!="possible_replay",k=~"a|b",l!~'c'}"#).unwrap();
        assert_eq!(
            got.metrics["j"],
            ["k", "l", "reason", "result"].map(String::from).into()
        );
        let ops: Vec<(&str, MatchOp, &str)> = got
            .matchers
            .iter()
            .map(|m| (m.label.as_str(), m.op, m.value.as_str()))
            .collect();
        assert_eq!(
            ops,
            [
                ("k", MatchOp::Regex, "a|b"),
                ("l", MatchOp::NotRegex, "c"),
                ("reason", MatchOp::NotEqual, "possible_replay"),
                ("result", MatchOp::Equal, "refused"),
            ]
        );
        // A value that looks like a metric, with an escaped quote in it.
        let got = names(r#"m{n="o_total \" p"}"#).unwrap();
        assert_eq!(got.metrics.keys().collect::<Vec<_>>(), ["m"]);
        let value: Vec<&str> = got.matchers.iter().map(|m| m.value.as_str()).collect();
        assert_eq!(value, ["o_total \" p"]);
        assert!(matches!(
            names(r#"m{n=="o"}"#),
            Err(ParseError::Operator { .. })
        ));
    }

    #[test]
    fn what_it_cannot_read_is_an_error() {
        assert!(matches!(
            names(r#"{__name__="x"}"#),
            Err(ParseError::NamelessSelector(_))
        ));
        assert!(matches!(
            names(r#"x{a="b}"#),
            Err(ParseError::UnterminatedString(_))
        ));
        assert!(matches!(
            names("rate(x[5m)"),
            Err(ParseError::Unbalanced(_))
        ));
        assert!(matches!(
            names("sum by (le"),
            Err(ParseError::Unbalanced(_))
        ));
        assert!(matches!(
            names("sum by (le + 1) (x)"),
            Err(ParseError::Unexpected { .. })
        ));
    }

    const SCRAPE: &str = r#"# HELP t_joins Joins.
# TYPE t_joins counter
t_joins_total{result="joined",reason="none"} 1
# TYPE t_seconds histogram
t_seconds_sum 0.5
t_seconds_count 1
t_seconds_bucket{le="+Inf"} 1
# TYPE t_leader gauge
t_leader 1
# TYPE t_quiet counter
# EOF
"#;

    #[test]
    fn a_scrape_has_exactly_the_stored_names_of_its_families() {
        let scrape = Scrape::parse(SCRAPE).unwrap();
        let ok = names(
            r#"sum by (reason) (t_joins_total{result="joined"}) + histogram_quantile(0.5, sum by (le) (rate(t_seconds_bucket[1m]))) + t_seconds_sum + t_leader{instance="a"}"#,
        )
        .unwrap();
        assert_eq!(scrape.missing(&ok, &["instance"]), Vec::<String>::new());
        for wrong in [
            "t_joins",        // a counter is stored with _total
            "t_leader_total", // a gauge is not
            "t_seconds",      // a histogram only as its parts
            "t_seconds_total",
            "t_quiet_total",             // exported, no sample to check labels on
            r#"t_leader{instance="a"}"#, // not a target label here
            r#"t_joins_total{phase="x"}"#,
            "sum by (phase) (t_joins_total)",
        ] {
            let missing = scrape.missing(&names(wrong).unwrap(), &[]);
            assert_eq!(missing.len(), 1, "{wrong}: {missing:?}");
        }
    }

    #[test]
    fn matcher_values_are_checked_against_the_scraped_values() {
        let scrape = Scrape::parse(SCRAPE).unwrap();
        let ok = names(
            r#"t_joins_total{result="joined", reason!="none", instance="x"} + t_joins_total{result=~"join.*", reason!~"no.*|yes", reason=""}"#,
        )
        .unwrap();
        assert_eq!(
            scrape.missing_values(&ok, &["instance"]),
            Vec::<String>::new()
        );
        for wrong in [
            r#"t_joins_total{result="refused"}"#, // a value never scraped
            r#"t_joins_total{reason!="None"}"#,   // excludes nothing
            r#"t_joins_total{result=~"join"}"#,   // anchored: matches nothing
            r#"t_joins_total{result!~"refused.*"}"#,
            r#"t_joins_total{result=~"("}"#, // not a regex
        ] {
            let missing = scrape.missing_values(&names(wrong).unwrap(), &[]);
            assert_eq!(missing.len(), 1, "{wrong}: {missing:?}");
        }
        // An escaped value in the scrape is compared unescaped.
        let escaped = Scrape::parse("# TYPE e counter\ne_total{a=\"x\\\"y\"} 1\n").unwrap();
        let query = names(r#"e_total{a="x\"y"}"#).unwrap();
        assert_eq!(escaped.missing_values(&query, &[]), Vec::<String>::new());
    }

    #[test]
    fn a_malformed_sample_is_an_error() {
        assert!(Scrape::parse("x{a=\"1} 1").is_err());
        assert!(Scrape::parse("# TYPE x").is_err());
        assert!(Scrape::parse("x{a} 1").is_err());
    }
}

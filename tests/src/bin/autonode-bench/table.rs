//! The results as the Markdown table docs/benchmarks.md quotes.

use crate::measure::join_steps;
use serde_json::Value;

/// The results as a Markdown table (what docs/benchmarks.md quotes).
pub(crate) fn table(results: &Value) -> String {
    let get = |key: &str| results.get(key).cloned().unwrap_or(Value::Null);
    let num = |key: &str| match get(key) {
        Value::Null => "–".to_string(),
        Value::Number(n) => thousands(&n.to_string()),
        other => other.to_string(),
    };
    let mib = |key: &str| {
        get(key)
            .as_f64()
            .map_or("–".into(), |b| format!("{:.1} MiB", b / 1048576.0))
    };
    let m = get("machine");
    let mut out = format!(
        "\nMachine: {} × {}, {:.0} GiB, Linux {}; Kubernetes {}\n\n",
        m["nproc"],
        m["cpu_model"].as_str().unwrap_or("?"),
        m["memory_bytes"].as_f64().unwrap_or(0.0) / 1073741824.0,
        m["kernel"].as_str().unwrap_or("?"),
        get("kubernetes").as_str().unwrap_or("?"),
    );
    let rows: Vec<(String, String)> = vec![
        (
            format!(
                "agent join p50 / p99 ({} joins, one at a time)",
                num("joins")
            ),
            format!("{} / {} ms", num("join_p50_ms"), num("join_p99_ms")),
        ),
        (
            "agent start to exit p50 (kubelet started, reports sent)".into(),
            format!("{} ms", num("agent_exit_p50_ms")),
        ),
        (
            format!("bare kubelet CSR p50 / p99 ({} CSRs)", num("bare_csrs")),
            format!("{} / {} ms", num("bare_csr_p50_ms"), num("bare_csr_p99_ms")),
        ),
        ("join / bare CSR (p50)".into(), num("join_vs_bare_ratio")),
        (
            "the join's API writes alone p50 (bind ∥ 2 CSRs, 2 approvals, 2 signatures)".into(),
            format!(
                "{} ms ({} × bare)",
                num("join_writes_p50_ms"),
                num("join_writes_vs_bare_ratio")
            ),
        ),
        (
            "join / its API writes alone (p50)".into(),
            num("join_vs_join_writes_ratio"),
        ),
        (
            "server's part of a join (mean, its histogram)".into(),
            format!("{} ms", num("join_server_mean_ms")),
        ),
        (
            format!("… of which {}", join_steps().join(" / ")),
            format!(
                "{} ms",
                join_steps()
                    .map(|step| get("join_server_steps_mean_ms")[step].to_string())
                    .join(" / ")
            ),
        ),
        (
            format!("burst: {} joins at once", num("burst_nodes")),
            format!(
                "{} s, {} failed, {} answers 503",
                num("burst_seconds"),
                num("burst_failures"),
                num("burst_503_answers")
            ),
        ),
        (
            "burst: the same machines' API writes alone, at once / burst over them".into(),
            format!(
                "{} s, {} failed / {}",
                num("burst_writes_alone_s"),
                num("burst_writes_alone_failures"),
                num("burst_ratio")
            ),
        ),
        (
            "burst: CPU of etcd / kube-apiserver / kcm / the bench's callers".into(),
            format!(
                "{} / {} / {} / {} s",
                num("burst_etcd_cpu_s"),
                num("burst_apiserver_cpu_s"),
                num("burst_kcm_cpu_s"),
                num("burst_bench_cpu_s")
            ),
        ),
        (
            "burst: server CPU (per join) / peak RSS".into(),
            format!(
                "{} s ({} ms) / {}",
                num("burst_server_cpu_s"),
                num("burst_server_cpu_per_join_ms"),
                mib("server_peak_rss_bytes")
            ),
        ),
        (
            "hostile burst: the same beside 64 slow bodies and 16 foreign-document streams".into(),
            format!(
                "{} s, {} failed, {} answers 503",
                num("hostile_burst_seconds"),
                num("hostile_burst_failures"),
                num("hostile_burst_503_answers")
            ),
        ),
        (
            "hostile burst: foreign documents answered / refused 403".into(),
            format!(
                "{} / {}",
                num("hostile_burst_foreign_answers"),
                num("hostile_burst_foreign_refused")
            ),
        ),
        (
            "hostile burst: server CPU / peak RSS".into(),
            format!(
                "{} s / {}",
                num("hostile_burst_server_cpu_s"),
                mib("hostile_burst_server_peak_rss_bytes")
            ),
        ),
        (
            format!("large burst: {} joins at once", num("burst_large_nodes")),
            format!(
                "{} s ({} × the burst), {} failed, {} answers 503",
                num("burst_large_seconds"),
                num("burst_large_vs_burst_ratio"),
                num("burst_large_failures"),
                num("burst_large_503_answers")
            ),
        ),
        (
            "large burst: server CPU (per join) / peak RSS".into(),
            format!(
                "{} s ({} ms) / {}",
                num("burst_large_server_cpu_s"),
                num("burst_large_server_cpu_per_join_ms"),
                mib("burst_large_server_peak_rss_bytes")
            ),
        ),
        (
            "stock path: kubelet TLS bootstraps at once (kcm approves client CSRs, one worker serving ones)".into(),
            format!(
                "{} s, {} failed",
                num("bare_bootstrap_burst_s"),
                num("bare_bootstrap_burst_failures")
            ),
        ),
        (
            "stock path: CPU of etcd / kube-apiserver / kcm / the bench's callers".into(),
            format!(
                "{} / {} / {} / {} s",
                num("bare_bootstrap_burst_etcd_cpu_s"),
                num("bare_bootstrap_burst_apiserver_cpu_s"),
                num("bare_bootstrap_burst_kcm_cpu_s"),
                num("bare_bootstrap_burst_bench_cpu_s")
            ),
        ),
        (
            format!(
                "renewal wave: {} nodes' client + serving CSRs at once, approved",
                num("renewal_wave_nodes")
            ),
            format!(
                "{} s, {} / s, {} left pending (p50 {} ms)",
                num("renewal_wave_seconds"),
                num("renewal_wave_per_s"),
                num("renewal_wave_pending"),
                num("renewal_wave_approval_p50_ms")
            ),
        ),
        (
            "renewal wave: server CPU (per approval) / API requests per approval / EC2 calls / 429s (APF)".into(),
            format!(
                "{} s ({} ms) / {} / {} / {}",
                num("renewal_wave_server_cpu_s"),
                num("renewal_wave_server_cpu_per_approval_ms"),
                get("renewal_wave_api_requests_per_approval")["total"],
                num("renewal_wave_ec2_calls"),
                num("renewal_wave_apf_rejected")
            ),
        ),
        (
            format!(
                "renewal wave, stock ({} nodes): kcm client approver (default limits) / one-worker serving approver",
                num("renewal_wave_stock_nodes")
            ),
            format!(
                "{} / s ({} s) / {} / s ({} s)",
                num("renewal_wave_stock_client_per_s"),
                num("renewal_wave_stock_client_seconds"),
                num("renewal_wave_stock_serving_per_s"),
                num("renewal_wave_stock_serving_seconds")
            ),
        ),
        (
            "identity verifications / s (one core)".into(),
            num("iid_verify_per_s"),
        ),
        (
            "openssl rsa2048 verify / s (same core)".into(),
            num("openssl_rsa2048_verify_per_s"),
        ),
        ("identity / openssl".into(), num("iid_vs_openssl_ratio")),
        (
            "agent binary (static, as packaged)".into(),
            format!(
                "{} bytes ({})",
                num("agent_size_bytes"),
                mib("agent_size_bytes")
            ),
        ),
        (
            "agent peak RSS / CPU per join".into(),
            format!(
                "{} / {} ms",
                mib("agent_peak_rss_bytes"),
                num("agent_cpu_ms")
            ),
        ),
    ];
    out.push_str("| measure | result |\n|---|---|\n");
    for (measure, result) in rows {
        out.push_str(&format!("| {measure} | {result} |\n"));
    }
    out.push_str(&requests_table(
        "API requests per join (one at a time)",
        &get("api_requests_per_join"),
    ));
    out.push_str(&requests_table(
        "API requests per join (the burst)",
        &get("burst_api_requests_per_join"),
    ));
    out.push_str(&crate::fleet::table(results));
    out
}

/// The server's API requests per join (the API server's audit log) beside
/// the floor a join cannot go below.
fn requests_table(title: &str, requests: &Value) -> String {
    let Some(by_request) = requests["by_request"].as_object() else {
        return String::new();
    };
    let mut out = format!(
        "\n{title}, from the audit log: {} (floor {})\n\n\
         | request | per join | floor |\n|---|---|---|\n",
        requests["total"], requests["floor_total"]
    );
    for (request, per_join) in by_request {
        let floor = requests["floor"].get(request).cloned().unwrap_or(0.into());
        out.push_str(&format!("| {request} | {per_join} | {floor} |\n"));
    }
    out
}

/// `12345.6` → `12,345.6`.
pub(crate) fn thousands(number: &str) -> String {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits: Vec<char> = int.chars().collect();
    let mut out = String::new();
    for (i, c) in digits.iter().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) && c.is_ascii_digit() {
            out.push(',');
        }
        out.push(*c);
    }
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out
}

//! The registry's recording rules, read back through the exposition text a scrape would show.

use std::time::Duration;

use super::scrape::counters;
use super::*;

fn text(m: &Metrics) -> String {
    let mut e = Exposition::default();
    counters(&mut e, m);
    e.finish()
}

/// The value of the sample `line_start` (the metric and its labels as written), if present.
fn value(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.parse().unwrap())
}

fn streamed_ok() -> RequestEnd<'static> {
    RequestEnd {
        model: "m",
        api: "/v1/chat/completions",
        operation: Some("chat"),
        status: 200,
        engine: "10.0.0.1:8000",
        prompt_tokens: 10,
        cached_tokens: 4,
        completion_tokens: 5,
        duration: Duration::from_millis(300),
        first_token: Some(Duration::from_millis(100)),
        ..RequestEnd::default()
    }
}

#[test]
fn a_successful_streamed_request_counts_everywhere() {
    let m = Metrics::new(true);
    m.request_ended(&streamed_ok());
    let t = text(&m);
    let req =
        "extproc_requests_total{model=\"m\",api=\"/v1/chat/completions\",status=\"200\",engine=\"10.0.0.1:8000\"}";
    assert_eq!(value(&t, req), Some(1.0));
    assert_eq!(value(&t, "extproc_prompt_tokens_total{model=\"m\"}"), Some(10.0));
    assert_eq!(value(&t, "extproc_cached_tokens_total{model=\"m\"}"), Some(4.0));
    assert_eq!(value(&t, "extproc_completion_tokens_total{model=\"m\"}"), Some(5.0));
    let usage =
        "gen_ai_client_token_usage_sum{gen_ai_operation_name=\"chat\",gen_ai_request_model=\"m\",gen_ai_token_type=";
    assert_eq!(value(&t, &format!("{usage}\"input\"}}")), Some(10.0));
    assert_eq!(value(&t, &format!("{usage}\"output\"}}")), Some(5.0));
    let ttft =
        "gen_ai_server_time_to_first_token_seconds_sum{gen_ai_operation_name=\"chat\",gen_ai_request_model=\"m\"}";
    assert_eq!(value(&t, ttft), Some(0.1));
    // (300 ms - 100 ms) over the 4 tokens after the first.
    let tpot =
        "gen_ai_server_time_per_output_token_seconds_sum{gen_ai_operation_name=\"chat\",gen_ai_request_model=\"m\"}";
    assert_eq!(value(&t, tpot), Some(0.05));
    let bucket =
        "gen_ai_server_request_duration_seconds_bucket{gen_ai_operation_name=\"chat\",gen_ai_request_model=\"m\",le=";
    assert_eq!(value(&t, &format!("{bucket}\"0.16\"}}")), Some(0.0));
    assert_eq!(value(&t, &format!("{bucket}\"0.32\"}}")), Some(1.0));
    assert_eq!(value(&t, &format!("{bucket}\"+Inf\"}}")), Some(1.0));
}

#[test]
fn a_failure_counts_its_status_and_error_type_but_no_token_usage_or_latency() {
    let m = Metrics::new(true);
    m.request_ended(&RequestEnd {
        status: 429,
        engine: "",
        prompt_tokens: 0,
        cached_tokens: 0,
        completion_tokens: 0,
        first_token: None,
        ..streamed_ok()
    });
    // A stream cut short after its 200: a failure of type stream_error.
    m.request_ended(&RequestEnd {
        failed: true,
        ..streamed_ok()
    });
    let t = text(&m);
    let req = "extproc_requests_total{model=\"m\",api=\"/v1/chat/completions\",status=\"429\"}";
    assert_eq!(value(&t, req), Some(1.0));
    let dur = "gen_ai_server_request_duration_seconds_count{gen_ai_operation_name=\"chat\",gen_ai_request_model=\"m\",error_type=";
    assert_eq!(value(&t, &format!("{dur}\"429\"}}")), Some(1.0));
    assert_eq!(value(&t, &format!("{dur}\"stream_error\"}}")), Some(1.0));
    assert!(!t.contains("gen_ai_client_token_usage_count{"));
    assert!(!t.contains("gen_ai_server_time_to_first_token_seconds_count{"));
}

#[test]
fn routing_kv_events_and_phases_are_counted_by_their_labels() {
    let m = Metrics::new(true);
    m.routed("m", "prefix_cache", Decision::Hit);
    m.routed("m", "prefix_cache", Decision::Hit);
    m.routed("m", "prefix_cache", Decision::Shed);
    m.kv_batch("e:1", "applied", 0.0);
    m.kv_batch("e:1", "gap", 0.0);
    m.kv_resync("e:1");
    m.phases[Phase::Route as usize].observe(2_000);
    let t = text(&m);
    let routing = "extproc_routing_decisions_total{model=\"m\",policy=\"prefix_cache\",reason=";
    assert_eq!(value(&t, &format!("{routing}\"hit\"}}")), Some(2.0));
    assert_eq!(value(&t, &format!("{routing}\"shed\"}}")), Some(1.0));
    assert_eq!(
        value(&t, "extproc_kv_event_batches_total{engine=\"e:1\",outcome=\"gap\"}"),
        Some(1.0)
    );
    assert_eq!(value(&t, "extproc_kv_event_resyncs_total{engine=\"e:1\"}"), Some(1.0));
    assert_eq!(
        value(&t, "extproc_phase_duration_seconds_count{phase=\"route\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(
            &t,
            "extproc_phase_duration_seconds_bucket{phase=\"route\",le=\"0.00001\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&t, "extproc_phase_duration_seconds_count{phase=\"parse\"}"),
        Some(0.0)
    );
}

#[test]
fn switched_off_it_counts_nothing() {
    let m = Metrics::new(false);
    m.request_ended(&streamed_ok());
    m.routed("m", "random", Decision::Miss);
    m.kv_resync("e:1");
    let t = text(&m);
    assert!(!t.contains("extproc_requests_total{"));
    assert!(!t.contains("extproc_routing_decisions_total{"));
    assert!(!t.contains("extproc_kv_event_resyncs_total{"));
}

#[test]
fn every_metric_has_one_help_and_type_and_only_declared_samples() {
    let m = Metrics::new(true);
    m.request_ended(&streamed_ok());
    let t = text(&m);
    let mut declared = Vec::new();
    for line in t.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap().to_string();
            assert!(!declared.contains(&name), "{name} declared twice");
            declared.push(name);
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| declared.iter().any(|d| d == b))
                .unwrap_or(name);
            assert!(declared.iter().any(|d| d == base), "{name} has no TYPE");
        }
    }
}

/// What counting costs per request, for docs/observability.md: one `request_ended` of a streamed
/// success plus the six phase observations and a routing decision a request makes (each phase with
/// its `Instant::now()`). `cargo test --release -p extproc-core metrics::tests::cost -- --ignored --nocapture`
#[test]
#[ignore]
fn cost_per_request() {
    let m = Metrics::new(true);
    let n = 200_000u32;
    let began = std::time::Instant::now();
    for _ in 0..n {
        let t = std::time::Instant::now();
        for p in Phase::ALL {
            let now = std::time::Instant::now();
            m.phases[p as usize].observe(nanos(now - t));
        }
        m.routed("m", "kv_events", Decision::Hit);
        m.request_ended(&streamed_ok());
    }
    let per = began.elapsed() / n;
    println!("metrics cost per request: {per:?}");
}

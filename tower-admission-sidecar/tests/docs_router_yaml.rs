//! The router deployments of `docs/deployment.md`, checked without a
//! cluster or a YAML library: the Gateway API Inference Extension's
//! `InferencePool` and its endpoint picker, and vLLM production stack's
//! `vllm-router`, send to and scrape the sidecar's port with the router
//! view on, never the engine's; and the nginx section resends on the
//! sidecar's `503`. The manifests follow one convention this test relies
//! on: a container's `args` and `ports` are YAML flow sequences.

mod docs;

/// The sidecar's port in the manifests, and the engine's.
const SIDECAR_PORT: &str = "9000";
const ENGINE_PORT: &str = "8000";

#[test]
fn the_inference_pool_targets_the_sidecar_which_serves_the_router_view() {
    let documents = router_documents("Gateway API Inference Extension");
    let workers = document(&documents, "Deployment", "llm-worker");
    let engine = container(workers, "engine");
    let sidecar = container(workers, "admission");

    assert_eq!(
        flag(&engine.args, "--host"),
        Some("127.0.0.1"),
        "{engine:?}"
    );
    assert_eq!(
        flag(&engine.args, "--port"),
        Some(ENGINE_PORT),
        "{engine:?}"
    );
    assert!(
        sidecar.args.iter().any(|arg| arg == "--router-view"),
        "{sidecar:?}"
    );
    assert_eq!(
        flag(&sidecar.args, "--upstream"),
        Some(format!("http://127.0.0.1:{ENGINE_PORT}").as_str())
    );
    assert_eq!(
        flag(&sidecar.args, "--listen"),
        Some(format!("0.0.0.0:{SIDECAR_PORT}").as_str())
    );
    assert_eq!(sidecar.container_ports, [SIDECAR_PORT], "{sidecar:?}");
    assert!(engine.container_ports.is_empty(), "{engine:?}");

    let pool = document(&documents, "InferencePool", "llm-worker");
    assert_eq!(
        top_level(pool, "apiVersion"),
        Some("inference.networking.k8s.io/v1")
    );
    let target = value_after(pool, "targetPorts:", "- number");
    assert_eq!(target, SIDECAR_PORT, "the pool sends to the sidecar");
    assert_ne!(target, ENGINE_PORT);
    assert!(pool.contains("app: llm-worker"), "{pool}");
}

#[test]
fn the_endpoint_picker_reads_the_vllm_gauges_the_router_view_serves() {
    let documents = router_documents("Gateway API Inference Extension");
    let config = document(&documents, "ConfigMap", "llm-worker-epp");
    assert!(config.contains("kind: EndpointPickerConfig"), "{config}");
    for (key, metric) in [
        ("queuedRequestsSpec", "vllm:num_requests_waiting"),
        ("runningRequestsSpec", "vllm:num_requests_running"),
        ("kvUsageSpec", "vllm:kv_cache_usage_perc"),
    ] {
        assert_eq!(
            value_after(config, "engineConfigs:", key).trim_matches('"'),
            metric
        );
    }
    // The picker scrapes the pool's target port: no other port is given.
    assert_eq!(
        value_after(config, "metrics-data-source", "path"),
        "/metrics"
    );
    for line in config.lines() {
        let key = line.split(" #").next().unwrap().split(':').next().unwrap();
        assert!(!key.to_lowercase().contains("port"), "{line}");
    }

    let picker = document(&documents, "Deployment", "llm-worker-epp");
    let epp = container(picker, "epp");
    assert_eq!(flag(&epp.args, "--pool-name"), Some("llm-worker"));
    assert_eq!(flag(&epp.args, "--config-file"), Some("/config/epp.yaml"));
    // Rejected since EPP 1.4: the metric names live in the config.
    assert!(
        !epp.args.iter().any(|arg| arg.ends_with("-metric")),
        "{epp:?}"
    );
    let route = document(&documents, "HTTPRoute", "llm");
    assert!(
        route.contains("kind: InferencePool, name: llm-worker"),
        "{route}"
    );
}

#[test]
fn the_production_stack_router_sends_to_the_sidecars() {
    let documents = router_documents("vLLM production stack");
    let router = container(document(&documents, "Deployment", "vllm-router"), "router");
    assert_eq!(flag(&router.args, "--service-discovery"), Some("static"));
    let backends: Vec<&str> = flag(&router.args, "--static-backends")
        .expect("--static-backends")
        .split(',')
        .collect();
    let models = flag(&router.args, "--static-models").expect("--static-models");
    assert_eq!(models.split(',').count(), backends.len(), "{router:?}");
    assert!(backends.len() >= 2, "{backends:?}");
    for backend in backends {
        let port = backend
            .strip_prefix("http://")
            .and_then(|rest| rest.rsplit_once(':'))
            .map(|(_, port)| port);
        assert_eq!(port, Some(SIDECAR_PORT), "{backend}");
    }
    assert!(flag(&router.args, "--engine-stats-interval").is_some());
    assert!(flag(&router.args, "--routing-logic").is_some());
}

#[test]
fn the_nginx_section_resends_the_sidecars_503() {
    let section = docs::section(docs::DEPLOYMENT, "nginx in front of sidecars");
    let config = docs::only_block(section, "nginx");
    let next_upstream = config
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("proxy_next_upstream "))
        .expect("a proxy_next_upstream line");
    let conditions: Vec<&str> = next_upstream
        .trim_end_matches(';')
        .split_whitespace()
        .skip(1)
        .collect();
    assert!(conditions.contains(&"http_503"), "{next_upstream}");
    assert!(conditions.contains(&"non_idempotent"), "{next_upstream}");

    let sidecars: Vec<&str> = docs::only_block(section, "sh")
        .lines()
        .filter(|line| line.starts_with("tower-admission "))
        .collect();
    assert_eq!(sidecars.len(), 2, "two sidecars started");
    for sidecar in sidecars {
        assert!(sidecar.contains("--overload-status 503"), "{sidecar}");
        // Each sidecar is one of nginx's upstream servers.
        let listen = sidecar
            .split_whitespace()
            .skip_while(|word| *word != "--listen")
            .nth(1)
            .expect("--listen");
        assert!(
            config.contains(&format!("server {listen} ")),
            "{listen} is not an upstream server of:\n{config}"
        );
    }
}

// ---------------------------------------------------------------------------
// Just enough YAML for the manifests of the docs.

/// The YAML documents of the subsection of "Routers that read engine
/// gauges" whose heading starts with `heading`.
fn router_documents(heading: &str) -> Vec<&'static str> {
    let section = docs::section(docs::DEPLOYMENT, "Routers that read engine gauges");
    let start = section
        .find(&format!("\n### {heading}"))
        .unwrap_or_else(|| panic!("no subsection {heading}"));
    let subsection = &section[start + 1..];
    let subsection = &subsection[..subsection[4..]
        .find("\n### ")
        .map_or(subsection.len(), |end| end + 4)];
    let documents: Vec<&str> = docs::blocks(subsection, "yaml")
        .into_iter()
        .flat_map(|block| block.split("\n---\n"))
        .collect();
    for document in &documents {
        assert!(!document.contains('\t'), "YAML is indented with spaces");
    }
    documents
}

/// The document of `kind` whose `metadata.name` is `name`.
#[track_caller]
fn document<'a>(documents: &[&'a str], kind: &str, name: &str) -> &'a str {
    documents
        .iter()
        .copied()
        .find(|document| {
            top_level(document, "kind") == Some(kind)
                && document.contains(&format!("metadata:\n  name: {name}\n"))
        })
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The value of a top-level `key:` of a document.
fn top_level<'a>(document: &'a str, key: &str) -> Option<&'a str> {
    document.lines().find_map(|line| {
        line.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// The value of the first `key:` after the first line containing
/// `anchor`, its comment removed.
#[track_caller]
fn value_after<'a>(document: &'a str, anchor: &str, key: &str) -> &'a str {
    let start = document
        .find(anchor)
        .unwrap_or_else(|| panic!("no {anchor} in:\n{document}"));
    document[start..]
        .lines()
        .skip(1)
        .find_map(|line| {
            line.trim()
                .strip_prefix(key)
                .and_then(|rest| rest.strip_prefix(':'))
        })
        .map(|value| value.split(" #").next().unwrap().trim())
        .unwrap_or_else(|| panic!("no {key}: after {anchor} in:\n{document}"))
}

#[derive(Debug)]
struct Container {
    args: Vec<String>,
    container_ports: Vec<String>,
}

/// The container `name` of a pod template: its `args` and the
/// `containerPort`s of its `ports`, both flow sequences.
#[track_caller]
fn container(document: &str, name: &str) -> Container {
    let start = document
        .find(&format!("- name: {name}\n"))
        .unwrap_or_else(|| panic!("no container {name} in:\n{document}"));
    let rest = &document[start + 1..];
    // Up to the next line as shallow as the `- name:`: the next
    // container, or the pod spec's next key.
    let indent = document[..start].rsplit('\n').next().unwrap().len();
    let end = rest
        .match_indices('\n')
        .map(|(at, _)| at + 1)
        .find(|&at| {
            let line = rest[at..].lines().next().unwrap_or_default();
            let depth = line.len() - line.trim_start().len();
            !line.trim().is_empty() && depth <= indent
        })
        .unwrap_or(rest.len());
    let body = &rest[..end];
    Container {
        args: flow_sequence(body, "args:").map_or_else(Vec::new, quoted),
        container_ports: flow_sequence(body, "ports:")
            .map(|ports| {
                ports
                    .split("containerPort:")
                    .skip(1)
                    .map(|rest| {
                        rest.trim_start()
                            .split(|c: char| !c.is_ascii_digit())
                            .next()
                            .unwrap()
                            .to_owned()
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The text between `[` and its `]` of a `key: [...]` flow sequence, which
/// may span lines.
fn flow_sequence<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    let start = body.find(&format!("{key} ["))? + key.len() + 2;
    let mut depth = 1;
    for (at, c) in body[start..].char_indices() {
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&body[start..start + at]);
                }
            }
            _ => {}
        }
    }
    panic!("an unclosed {key} sequence in:\n{body}")
}

/// Every double-quoted string of `text`, in order (comments removed).
fn quoted(text: &str) -> Vec<String> {
    let text: String = text
        .lines()
        .map(|line| match line.find(" #") {
            Some(comment) if line[..comment].matches('"').count() % 2 == 0 => &line[..comment],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    text.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|arg| arg == flag)
        .and_then(|at| args.get(at + 1))
        .map(String::as_str)
}

//! The Kubernetes manifests of `docs/deployment.md` for autoscaling on the
//! saturation gauge: each block is YAML of the expected `apiVersion` and
//! `kind`, indented with spaces, naming the gauge the crate records. (The
//! HorizontalPodAutoscaler and the adapter's ConfigMap were also validated
//! offline against the Kubernetes schemas with `kubernetes-validate`; no
//! offline schema of KEDA's CRDs is packaged.)
#![cfg(feature = "metrics")]

const DOC: &str = include_str!("../docs/deployment.md");

/// The YAML documents of the autoscaling section, in order.
fn autoscaling_documents() -> Vec<String> {
    let start = DOC
        .find("## Autoscaling on saturation")
        .expect("the autoscaling section");
    let section = &DOC[start..];
    let section = &section[..section[3..]
        .find("\n## ")
        .map_or(section.len(), |end| end + 3)];
    let mut documents = Vec::new();
    let mut rest = section;
    while let Some(open) = rest.find("```yaml\n") {
        let body = &rest[open + "```yaml\n".len()..];
        let close = body.find("```").expect("a closed block");
        for document in body[..close].split("\n---\n") {
            documents.push(document.to_owned());
        }
        rest = &body[close + 3..];
    }
    documents
}

/// The value of a top-level `key:` of a document.
fn top_level<'a>(document: &'a str, key: &str) -> Option<&'a str> {
    document.lines().find_map(|line| {
        line.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

#[test]
fn the_autoscaling_manifests_name_the_right_apis_and_the_gauge() {
    let documents = autoscaling_documents();
    let kinds: Vec<(Option<&str>, Option<&str>)> = documents
        .iter()
        .map(|document| {
            (
                top_level(document, "apiVersion"),
                top_level(document, "kind"),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (Some("v1"), Some("ConfigMap")),
            (Some("autoscaling/v2"), Some("HorizontalPodAutoscaler")),
            (Some("keda.sh/v1alpha1"), Some("ScaledObject")),
        ]
    );
    let gauge = format!("{}_saturation", tower_admission::metrics::DEFAULT_PREFIX);
    for document in &documents {
        assert!(!document.contains('\t'), "YAML is indented with spaces");
        assert!(document.contains(&gauge), "names {gauge}: {document}");
        assert!(top_level(document, "metadata").is_some());
    }
    // Both scalers scale the Deployment the sidecar manifest defines.
    for scaler in &documents[1..] {
        assert!(scaler.contains("kind: Deployment") && scaler.contains("name: llm-worker"));
    }
    assert!(DOC.contains("kind: Deployment\nmetadata:\n  name: llm-worker"));
}

#[test]
fn the_gauge_the_manifests_name_is_recorded_with_the_setting() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let _gate = tower_admission::Gate::new(
            tower_admission::AdmissionConfig::new().saturation_metric(true),
        );
    });
    let gauge = format!("{}_saturation", tower_admission::metrics::DEFAULT_PREFIX);
    let names: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, ..)| key.key().name().to_owned())
        .collect();
    assert!(names.contains(&gauge), "{names:?}");
}

//! crds/ must be what the Rust types generate, and every field of every CRD must say what it is
//! for `kubectl explain`.

mod common;

use std::path::Path;

use kube::CustomResourceExt;
use kuport_controller::api::{Intercept, PortMap, PortMapClass};
use serde_json::Value;

#[test]
fn crds_folder_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/kuport.wlz.li.yaml");
    let want = kuport_controller::api::crds::yaml().expect("CRDs serialise");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is stale; regenerate it with: cargo run -p kuport-controller --bin kuport-controller -- crds > crds/kuport.wlz.li.yaml \
         (and copy it to charts/kuport/crds/)",
        path.display()
    );
}

/// Every CRD as JSON: (kind, plural, its v1alpha1 openAPIV3Schema).
fn schemas() -> Vec<(String, String, Value)> {
    [PortMapClass::crd(), PortMap::crd(), Intercept::crd()]
        .into_iter()
        .map(|crd| {
            let v = serde_json::to_value(&crd).expect("CRD as JSON");
            let schema = v["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
            assert!(schema.is_object(), "{}: no openAPIV3Schema", crd.spec.names.kind);
            (crd.spec.names.kind.clone(), crd.spec.names.plural.clone(), schema)
        })
        .collect()
}

/// Walks a schema: every property (of objects, array items, map values, and the branches of
/// allOf/anyOf/oneOf) is called with its path, as `kubectl explain` spells it (arrays and maps
/// are walked through: `status.published.node`), and its schema.
fn walk(schema: &Value, path: &str, f: &mut dyn FnMut(&str, &Value)) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let p = format!("{path}.{name}");
            f(&p, prop);
            walk(prop, &p, f);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(inner) = schema.get(key).filter(|v| v.is_object()) {
            walk(inner, path, f);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for branch in schema.get(key).and_then(Value::as_array).into_iter().flatten() {
            walk(branch, path, f);
        }
    }
}

fn description(schema: &Value) -> Option<&str> {
    schema.get("description").and_then(Value::as_str).map(str::trim).filter(|d| !d.is_empty())
}

/// The paths under `schema` without a description.
fn undescribed(schema: &Value, root: &str) -> Vec<String> {
    let mut missing = Vec::new();
    walk(schema, root, &mut |path, prop| {
        // A $ref'd type (the API server's published ObjectMeta) carries its own.
        if description(prop).is_none() && prop.get("$ref").is_none() {
            missing.push(path.to_string());
        }
    });
    missing
}

#[test]
fn every_crd_field_has_a_description() {
    let mut missing = Vec::new();
    let mut fields = 0;
    for (kind, _, schema) in schemas() {
        walk(&schema, &kind, &mut |_, _| fields += 1);
        missing.extend(undescribed(&schema, &kind));
    }
    assert!(fields > 80, "the walk found only {fields} fields: is it still reading the schema?");
    assert!(
        missing.is_empty(),
        "these CRD fields have no description for `kubectl explain` (add a doc comment in controller/src/api/): {missing:#?}"
    );
}

/// The walk finds a field without a description, nested in arrays and maps too.
#[test]
fn the_description_walk_names_the_bare_field() {
    let schema = serde_json::json!({"properties": {
        "spec": {"description": "d", "properties": {
            "a": {"description": "d", "type": "string"},
            "b": {"type": "integer"},
            "list": {"description": "d", "items": {"properties": {"x": {"type": "string"}}}},
            "map": {"description": "d", "additionalProperties": {"properties": {"y": {"description": " "}}}}
        }},
        "status": {"type": "object"}
    }});
    assert_eq!(undescribed(&schema, "K"), ["K.spec.b", "K.spec.list.x", "K.spec.map.y", "K.status"]);
}

/// Squeezes whitespace, as `kubectl explain` rewraps descriptions.
fn squeeze(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// On the lab's real API server: the schema it publishes (what `kubectl explain` reads) keeps
/// every description, and `kubectl explain` prints them for the fields a new user asked about.
#[test]
fn kubectl_explain_prints_the_descriptions() {
    let cp = common::ControlPlane::up("explain");
    cp.apply_file(&common::repo().join("crds/kuport.wlz.li.yaml"));
    cp.established(&["crd/portmapclasses.kuport.wlz.li", "crd/portmaps.kuport.wlz.li", "crd/intercepts.kuport.wlz.li"]);
    // The API server publishes a new CRD's OpenAPI a moment after it is Established: wait for
    // all three kinds.
    let path = "/openapi/v3/apis/kuport.wlz.li/v1alpha1";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let published: Value = loop {
        let got = cp.kubectl(&["get", "--raw", path], None);
        if let Ok(text) = &got {
            let v: Value = serde_json::from_str(text).expect("the published OpenAPI is JSON");
            if schemas()
                .iter()
                .all(|(kind, _, _)| v["components"]["schemas"][format!("li.wlz.kuport.v1alpha1.{kind}")].is_object())
            {
                break v;
            }
        }
        assert!(std::time::Instant::now() < deadline, "{path} lacks kuport's kinds after 60 s: {got:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let mut missing = Vec::new();
    let mut fields = 0;
    for (kind, _, _) in schemas() {
        let component = &published["components"]["schemas"][format!("li.wlz.kuport.v1alpha1.{kind}")];
        assert!(component.is_object(), "the API server publishes no schema for {kind}");
        walk(component, &kind, &mut |_, _| fields += 1);
        missing.extend(undescribed(component, &kind));
    }
    assert!(fields > 80, "the published schemas have only {fields} fields");
    assert!(missing.is_empty(), "published without a description: {missing:#?}");

    let generated = schemas();
    let want = |kind: &str, path: &str| -> String {
        let (_, _, schema) = generated.iter().find(|(k, _, _)| k == kind).expect("kind");
        let mut found = None;
        walk(schema, kind, &mut |p, prop| {
            if p == format!("{kind}.{path}") {
                found = description(prop).map(squeeze);
            }
        });
        found.unwrap_or_else(|| panic!("{kind}.{path}: no such field or no description"))
    };
    // A discovery cache written before the CRDs' group was served (by `kubectl wait` above)
    // would hide them from explain: read discovery anew, now that the schemas are published.
    let fresh = cp.dir.join("explain-cache");
    let fresh = fresh.to_string_lossy();
    // The fields of the report (issue 28), then one of each kind of nesting.
    for (kind, path) in [
        ("PortMap", "spec.className"),
        ("PortMap", "spec.protocol"),
        ("PortMap", "spec.serviceRef"),
        ("PortMapClass", "spec.returnPath.mode"),
        ("PortMapClass", "spec.returnPath.vxlan"),
        ("PortMapClass", "spec.ports.min"),
        ("PortMapClass", "spec.ports.max"),
        ("Intercept", "spec.intercepts.protocol"),
        ("PortMap", "status.published.node"),
        ("PortMapClass", "status.nodes.addresses.interface"),
        ("Intercept", "status.pods.reason"),
    ] {
        let field = format!("{}.{path}", kind.to_lowercase());
        let out = squeeze(&cp.ok(&["--cache-dir", &fresh, "explain", &field], None));
        let text = want(kind, path);
        assert!(out.contains(&text), "kubectl explain {field} does not print its description {text:?}:\n{out}");
    }
}

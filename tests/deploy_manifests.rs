//! The Kubernetes base in deploy/kubernetes: it renders and passes strict
//! schema validation (validate.sh), the validator really rejects an unknown
//! field, and the ConfigMap's switchyard.toml passes `switchyard check-config`.
//! validate.sh needs kubectl or kustomize and kubernetes-validate; without them
//! the tests are skipped loudly, except under CI (`CI` set), where they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
/// validate.sh's exit code for a missing tool.
const MISSING_TOOL: i32 = 3;

fn base_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

fn validate(dir: &Path) -> Output {
    Command::new("bash")
        .arg(dir.join("validate.sh"))
        .output()
        .expect("run validate.sh")
}

/// Runs validate.sh on `dir`; None (after failing under CI or printing a
/// SKIPPED notice) when a tool is missing.
fn run_validate(dir: &Path) -> Option<(i32, String)> {
    let out = validate(dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let code = out.status.code().unwrap_or(-1);
    if code == MISSING_TOOL {
        if std::env::var_os("CI").is_some() {
            panic!(
                "CI is set but validate.sh lacks a tool; CI must install them \
                 (apt-get install kubernetes-client unless kubectl exists; \
                 pip install -r deploy/kubernetes/requirements.txt):\n{text}"
            );
        }
        eprintln!(
            "\n*** SKIPPED deploy_manifests: apt-get install kubernetes-client; \
             pip install -r deploy/kubernetes/requirements.txt ***\n{text}"
        );
        return None;
    }
    Some((code, text))
}

#[test]
fn the_kubernetes_base_validates_strictly() {
    let Some((code, text)) = run_validate(&base_dir()) else {
        return;
    };
    assert_eq!(code, 0, "validate.sh failed:\n{text}");
    assert!(text.contains("validate.sh: ok (9 objects"), "{text}");
}

#[test]
fn the_validator_rejects_an_unknown_field() {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(base_dir()).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_file() {
            continue;
        }
        std::fs::copy(&path, tmp.path().join(path.file_name().unwrap())).unwrap();
    }
    let deployment = tmp.path().join("deployment.yaml");
    let text = std::fs::read_to_string(&deployment).unwrap();
    let needle = "      terminationGracePeriodSeconds: 45\n";
    assert!(
        text.contains(needle),
        "deployment.yaml changed; update this test"
    );
    std::fs::write(
        &deployment,
        text.replace(
            needle,
            &format!("{needle}      terminationGracePeriod: 45\n"),
        ),
    )
    .unwrap();
    let Some((code, text)) = run_validate(tmp.path()) else {
        return;
    };
    assert_eq!(code, 1, "an unknown field must fail validation:\n{text}");
    assert!(
        text.contains("'terminationGracePeriod' was unexpected"),
        "{text}"
    );
}

/// The `switchyard.toml: |` block of configmap.yaml, unindented.
fn configmap_toml() -> String {
    let yaml = std::fs::read_to_string(base_dir().join("configmap.yaml")).unwrap();
    let mut lines = yaml
        .lines()
        .skip_while(|l| l.trim() != "switchyard.toml: |");
    assert!(
        lines.next().is_some(),
        "configmap.yaml has no switchyard.toml"
    );
    let mut out = String::new();
    for line in lines {
        if line.trim().is_empty() {
            out.push('\n');
        } else if let Some(rest) = line.strip_prefix("    ") {
            out.push_str(rest);
            out.push('\n');
        } else {
            break; // the next key of `data:`
        }
    }
    out
}

#[test]
fn the_configmap_config_passes_check_config() {
    let toml = configmap_toml();
    assert!(toml.contains("grpc_listen = \"0.0.0.0:50051\""), "{toml}");
    assert!(toml.contains("admin_listen = \"0.0.0.0:9464\""), "{toml}");
    let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(file.path(), &toml).unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(file.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "check-config rejected the ConfigMap's switchyard.toml: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ok (2 providers, 1 routes)"), "{stdout}");
}

#[test]
fn the_pod_ports_match_the_config() {
    let d = std::fs::read_to_string(base_dir().join("deployment.yaml")).unwrap();
    for want in [
        "containerPort: 50051",
        "containerPort: 9464",
        "prometheus.io/port: \"9464\"",
        "mountPath: /etc/switchyard\n",
        "service: switchyard.v1.Router",
    ] {
        assert!(d.contains(want), "deployment.yaml lacks `{want}`");
    }
    let dockerfile = std::fs::read_to_string(base_dir().join("../Dockerfile")).unwrap();
    assert!(dockerfile.contains("\"--config\", \"/etc/switchyard/switchyard.toml\""));
}

/// Bytes of a Kubernetes quantity (`1536Mi`) or a Redis size (`1gb`).
fn bytes_of(q: &str) -> u64 {
    let q = q.trim().trim_matches('"');
    let digits: String = q.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: u64 = digits.parse().unwrap();
    let unit = match &q[digits.len()..] {
        "" | "b" => 1,
        "Ki" | "kb" => 1 << 10,
        "Mi" | "mb" => 1 << 20,
        "Gi" | "gb" => 1 << 30,
        other => panic!("unit `{other}` in `{q}`"),
    };
    n * unit
}

/// The value after `key:` within the `limits:` block of redis.yaml.
fn redis_limit(yaml: &str, key: &str) -> String {
    let mut in_limits = false;
    for line in yaml.lines() {
        let t = line.trim();
        if t == "limits:" {
            in_limits = true;
        } else if in_limits {
            if let Some(v) = t.strip_prefix(&format!("{key}:")) {
                return v.trim().to_string();
            }
        }
    }
    panic!("redis.yaml has no limits.{key}");
}

/// The argument after `flag` in redis.yaml's `args:`.
fn redis_arg(yaml: &str, flag: &str) -> String {
    let lines: Vec<&str> = yaml.lines().map(str::trim).collect();
    let at = lines
        .iter()
        .position(|l| *l == format!("- {flag}"))
        .unwrap_or_else(|| panic!("redis.yaml does not pass {flag}"));
    lines[at + 1].trim_start_matches("- ").to_string()
}

#[test]
fn the_shipped_redis_has_a_maxmemory_below_its_limit_with_noeviction_and_room_beside_files() {
    let yaml = std::fs::read_to_string(base_dir().join("redis.yaml")).unwrap();
    let limit = bytes_of(&redis_limit(&yaml, "memory"));
    let maxmemory = bytes_of(&redis_arg(&yaml, "--maxmemory"));
    assert_eq!(redis_arg(&yaml, "--maxmemory-policy"), "noeviction");
    assert!(
        maxmemory > 0 && maxmemory * 4 <= limit * 3,
        "maxmemory {maxmemory} leaves the fork and buffers a quarter of the {limit} limit"
    );
    // The files' budget leaves most of Redis to jobs, keys and ledgers.
    let toml = configmap_toml();
    let stored: u64 = toml
        .lines()
        .find_map(|l| l.strip_prefix("max_stored_bytes = "))
        .expect("the ConfigMap sets queue.max_stored_bytes")
        .trim()
        .parse()
        .unwrap();
    assert!(stored * 2 <= maxmemory, "{stored} of {maxmemory}");
}

/// The image builds from a context that holds only what its Dockerfile
/// copies (and its dockerignore lets through): every top-level directory the
/// release build reads (the workspace's members, the proto, and every
/// `include_str!` outside a member, such as the built-in drills) is in both.
#[test]
fn the_image_build_copies_everything_the_release_build_reads() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(base_dir().join("../Dockerfile")).unwrap();
    let ignore = std::fs::read_to_string(base_dir().join("../Dockerfile.dockerignore")).unwrap();
    let mut needed = std::collections::BTreeSet::from(["src".to_string(), "proto".to_string()]);
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for member in cargo.split('"').filter(|s| s.starts_with("crates/")) {
        needed.insert(member.split('/').next().unwrap().to_string());
    }
    // Non-test sources only: a `#[cfg(test)]` module is not in the image.
    fn scan(dir: &Path, root: &Path, needed: &mut std::collections::BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                scan(&path, root, needed);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let text = text.split("#[cfg(test)]").next().unwrap();
            for piece in text.split("include_str!(\"").skip(1) {
                let rel = piece.split('"').next().unwrap();
                let file = path.parent().unwrap().join(rel).canonicalize().unwrap();
                let top = file
                    .strip_prefix(root)
                    .unwrap()
                    .components()
                    .next()
                    .unwrap();
                needed.insert(top.as_os_str().to_string_lossy().into_owned());
            }
        }
    }
    let root = root.canonicalize().unwrap();
    scan(&root.join("src"), &root, &mut needed);
    scan(&root.join("crates"), &root, &mut needed);
    assert!(
        needed.contains("drills"),
        "the drills are compiled in: {needed:?}"
    );
    for dir in &needed {
        assert!(
            dockerfile.contains(&format!("COPY {dir} ./{dir}")),
            "deploy/Dockerfile does not copy {dir}/"
        );
        assert!(
            ignore.lines().any(|l| l == format!("!{dir}/")),
            "deploy/Dockerfile.dockerignore keeps {dir}/ out of the context"
        );
    }
}

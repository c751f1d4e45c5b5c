//! Property test of the admin REST API against its own OpenAPI description
//! (issue 10): schemathesis (PyPI, pinned in .ci/run, installed next to the
//! test Python) generates requests for every operation of the description
//! served by a running standalone broker and checks that no answer is a
//! server error (5xx other than the documented 503) and that every status is
//! one the description documents. CI form: a few examples per operation,
//! bounded in time; `CMS_TEST_LONG=1`: many more.

use std::time::Duration;

use cms_tests::cluster::{BrokerNode, python};

fn long() -> bool {
    std::env::var("CMS_TEST_LONG").is_ok_and(|v| v == "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_answers_match_its_openapi_description() {
    let st = python().with_file_name("schemathesis");
    assert!(
        st.is_file(),
        "{} missing: install schemathesis next to the test Python (see .ci/run)",
        st.display()
    );
    let broker = BrokerNode::start_standalone(&[]).await;
    let http = broker.http();
    let schema = format!("http://{http}/admin/v2/openapi.json");
    let (examples, bound) = if long() { ("100", 1_800) } else { ("5", 150) };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = tokio::process::Command::new(&st);
    cmd.args([
        "run",
        &schema,
        "--url",
        &format!("http://{http}"),
        "--checks",
        "not_a_server_error,status_code_conformance",
        "--max-examples",
        examples,
        "--request-timeout",
        "10",
        "--generation-deterministic",
        "--continue-on-failure",
        "--workers",
        "2",
    ])
    .current_dir(dir.path())
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .kill_on_drop(true);
    let child = cmd.spawn().expect("starting schemathesis");
    let out = tokio::time::timeout(Duration::from_secs(bound), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("schemathesis did not finish within {bound} s"))
        .expect("schemathesis output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "schemathesis found failures ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

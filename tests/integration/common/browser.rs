//! Driving a real browser (Debian's `chromium`, headless) from a test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--virtual-time-budget=20000",
];
const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

/// The browser to drive: `GACC_CHROMIUM`, else the first of Debian's and others' names on PATH.
/// None (a skip) unless `GACC_REQUIRE_BROWSER=1`, which makes a missing browser a failure.
pub fn chromium() -> Option<PathBuf> {
    let found = std::env::var_os("GACC_CHROMIUM").map(PathBuf::from).or_else(|| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .flat_map(|dir| ["chromium", "chromium-browser", "google-chrome"].map(|name| dir.join(name)))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("GACC_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "GACC_REQUIRE_BROWSER=1 but no chromium was found (install it: apt-get install -y chromium)"
        );
        // Written to the stderr handle itself: the test harness captures eprintln! of a passing test.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED: browser test: no chromium on PATH (apt-get install -y chromium; GACC_REQUIRE_BROWSER=1 makes this a failure)\n",
        );
    }
    found
}

/// Runs the browser on `url` with `args`, returns its stdout.
pub fn browse(browser: &Path, args: &[String], url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(browser)
        .args(CHROMIUM_FLAGS)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).map(|_| text)
    });
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > BROWSER_TIMEOUT {
            let _ = child.kill();
            panic!("chromium did not finish within {BROWSER_TIMEOUT:?} on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap().unwrap()
}

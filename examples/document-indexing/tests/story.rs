//! The scripted story in `src/bin/story.rs` runs to its end against the real server.

#[test]
fn the_story_runs_and_ends_with_the_newest_version_current() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_story"))
        .output()
        .expect("run the example binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("created: true") && stdout.matches("created: false").count() == 2,
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("already done, nothing written").count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("became current: false"), "{stdout}");
    assert!(
        stdout.ends_with("story complete: version 3 is current\n"),
        "{stdout}"
    );
}

//! The GPU test's runner (`harness = false` in Cargo.toml). libtest fixes
//! which tests are ignored when it compiles them, but whether a GPU test can
//! run is only known on the machine that runs it: there a test returns
//! [`Skip`] with the reason, and is reported the way libtest reports an
//! ignored test (`test NAME ... ignored, REASON`, counted in "N ignored"),
//! not as passed. Output and exit status otherwise follow libtest's, so
//! `cargo test` reads the same.
//!
//! With `FLASHCORE_SKIP_LOG` set (ctest sets it, as for the C GPU tests in
//! tests/CMakeLists.txt), each skipped test appends its reason as one line to
//! that file, and ctest sums them up after the run ("N GPU tests skipped: why").
//!
//! Arguments, as libtest's: `FILTER...` (run the tests whose names contain
//! one), `--exact` (names equal to a filter), `--skip FILTER`,
//! `--test-threads N` (default: `RUST_TEST_THREADS`, else the number of
//! cores), `--list`. `--nocapture` and `--show-output` are accepted and
//! change nothing: this runner never captures what tests print.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

/// Why a test could not run on this machine (no GPU, no kernel for its shapes).
#[derive(Debug)]
pub struct Skip(pub String);

/// What a test returns when it does not panic: it ran, or it could not.
pub type Outcome = Result<(), Skip>;

/// A test: its name and its function.
pub struct Test {
    pub name: &'static str,
    pub run: fn() -> Outcome,
}

/// `[Test]`s named after their functions.
macro_rules! tests {
    ($($function:ident),* $(,)?) => {
        [$($crate::harness::Test { name: stringify!($function), run: $function }),*]
    };
}

struct Options {
    filters: Vec<String>,
    skip: Vec<String>,
    exact: bool,
    list: bool,
    threads: usize,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let default_threads = match std::env::var("RUST_TEST_THREADS") {
        Ok(value) => value.parse().map_err(|_| format!("RUST_TEST_THREADS={value} is not a number"))?,
        Err(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut options = Options { filters: vec![], skip: vec![], exact: false, list: false, threads: default_threads };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--nocapture" | "--show-output" => {}
            "--exact" => options.exact = true,
            "--list" => options.list = true,
            "--skip" => options.skip.push(value("--skip")?),
            "--test-threads" => {
                let threads = value("--test-threads")?;
                options.threads = threads.parse().map_err(|_| format!("--test-threads {threads}: not a number"))?;
            }
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            filter => options.filters.push(filter.to_owned()),
        }
    }
    if options.threads == 0 {
        return Err("the number of test threads must be at least 1".into());
    }
    Ok(options)
}

impl Options {
    fn selects(&self, name: &str) -> bool {
        let matches = |filter: &String| if self.exact { name == filter } else { name.contains(filter.as_str()) };
        (self.filters.is_empty() || self.filters.iter().any(matches)) && !self.skip.iter().any(matches)
    }
}

/// Appends `reason` (one line) to `$FLASHCORE_SKIP_LOG`, if set, in one
/// write so that test binaries running at once do not mix their lines.
fn log_skip(reason: &str) {
    let path = match std::env::var_os("FLASHCORE_SKIP_LOG") {
        Some(path) if !path.is_empty() => path,
        _ => return,
    };
    let line = format!("{reason}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut log| log.write_all(line.as_bytes()));
    if let Err(err) = written {
        eprintln!("warning: cannot append to FLASHCORE_SKIP_LOG={}: {err}", path.to_string_lossy());
    }
}

/// Runs the tests the command line selects, each on a thread named after
/// it, at most `--test-threads` at once; prints libtest's lines and returns
/// its exit status (101 when a test failed).
pub fn run(tests: &[Test]) -> ExitCode {
    let options = match parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(why) => {
            eprintln!("error: {why}");
            return ExitCode::from(101);
        }
    };
    let selected: Vec<&Test> = tests.iter().filter(|test| options.selects(test.name)).collect();
    let filtered_out = tests.len() - selected.len();
    if options.list {
        for test in &selected {
            println!("{}: test", test.name);
        }
        println!("\n{} tests, 0 benchmarks", selected.len());
        return ExitCode::SUCCESS;
    }

    let start = Instant::now();
    println!("\nrunning {} test{}", selected.len(), if selected.len() == 1 { "" } else { "s" });
    let (mut passed, mut ignored, mut failed) = (0, 0, Vec::new());
    let next = AtomicUsize::new(0);
    let (results, finished) = mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..options.threads.min(selected.len()) {
            let (next, results, selected) = (&next, results.clone(), &selected);
            scope.spawn(move || {
                while let Some(test) = selected.get(next.fetch_add(1, Ordering::Relaxed)) {
                    // A thread of its own, so that a panic names the test (as
                    // with libtest) and fails only it.
                    let outcome = std::thread::Builder::new().name(test.name.to_owned()).spawn(test.run).map_or_else(
                        |err| Err(format!("cannot start a thread: {err}")),
                        |thread| thread.join().map_err(|_| "panicked".to_owned()),
                    );
                    if results.send((test.name, outcome)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(results);
        for (name, outcome) in finished {
            match outcome {
                Ok(Ok(())) => {
                    println!("test {name} ... ok");
                    passed += 1;
                }
                Ok(Err(Skip(reason))) => {
                    let reason = reason.replace('\n', " ");
                    println!("test {name} ... ignored, {reason}");
                    log_skip(&reason);
                    ignored += 1;
                }
                Err(why) => {
                    println!("test {name} ... FAILED ({why})");
                    failed.push(name);
                }
            }
        }
    });

    if !failed.is_empty() {
        println!("\nfailures:");
        for name in &failed {
            println!("    {name}");
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {} failed; {ignored} ignored; 0 measured; {filtered_out} filtered out; \
         finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len(),
        start.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(101)
    }
}

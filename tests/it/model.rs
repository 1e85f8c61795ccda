//! The spin model of the protocol (issue 20, model/README.md): it names the code's crash points
//! and recovery steps, and it is checked here, so that model and code cannot drift apart and a
//! change that breaks a property fails CI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the code names: `crash_point("…")` calls (and the crash-point table of
/// `src/failpoints.rs`, which also lists the points reached through a name passed in), and the
/// variants of the enum `choose_recovery_step` returns.
#[derive(Debug, Clone, Default)]
struct CodeNames {
    crash_points: BTreeSet<String>,
    recovery_steps: BTreeSet<String>,
}

/// What the model names: `CRASH(x)`/`STEP(X)` where it models them, `LEFT_OUT_CRASH(x)`/
/// `LEFT_OUT_STEP(X)` where it deliberately does not. A crash point's dots are underscores.
#[derive(Debug, Clone, Default)]
struct ModelNames {
    crash_points: BTreeSet<String>,
    left_out_crash_points: BTreeSet<String>,
    recovery_steps: BTreeSet<String>,
    left_out_recovery_steps: BTreeSet<String>,
}

/// Everything that differs between code and model, one line each; empty when they agree.
fn drift(code: &CodeNames, model: &ModelNames) -> Vec<String> {
    let code_crash_points: BTreeSet<String> = code.crash_points.iter().map(|name| name.replace('.', "_")).collect();
    let mut report = Vec::new();
    compare("crash point", &code_crash_points, &model.crash_points, &model.left_out_crash_points, &mut report);
    compare("recovery step", &code.recovery_steps, &model.recovery_steps, &model.left_out_recovery_steps, &mut report);
    report
}

fn compare(
    what: &str,
    code: &BTreeSet<String>,
    modelled: &BTreeSet<String>,
    left_out: &BTreeSet<String>,
    report: &mut Vec<String>,
) {
    for name in code.iter().filter(|name| !modelled.contains(*name) && !left_out.contains(*name)) {
        report.push(format!("{what} {name} is in the code but the model neither models it nor lists it as left out"));
    }
    for name in modelled.union(left_out).filter(|name| !code.contains(*name)) {
        report.push(format!("{what} {name} is named by the model but does not exist in the code"));
    }
    for name in modelled.intersection(left_out) {
        report.push(format!("{what} {name} is both modelled and listed as left out"));
    }
}

/// The string literals passed to `crash_point("…")` in one source file.
fn crash_point_calls(source: &str) -> Vec<String> {
    let call = "crash_point(\"";
    source
        .match_indices(call)
        .filter_map(|(at, _)| {
            let rest = &source[at + call.len()..];
            rest.find('"').map(|end| rest[..end].to_owned())
        })
        .collect()
}

/// The names in the crash-point table of `src/failpoints.rs` (rows `//! | \`name\` | …`).
fn crash_point_table(failpoints: &str) -> Vec<String> {
    failpoints
        .lines()
        .filter_map(|line| line.trim().strip_prefix("//! | `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// The variants of the enum `choose_recovery_step` returns (`-> Option<Enum>`), found in the
/// given sources.
fn recovery_steps(sources: &[String]) -> Vec<String> {
    let signature = "fn choose_recovery_step(";
    let enum_name = sources
        .iter()
        .find_map(|source| {
            let after = &source[source.find(signature)?..];
            let returned = &after[after.find("-> Option<")? + "-> Option<".len()..];
            Some(returned[..returned.find('>')?].trim().to_owned())
        })
        .expect("choose_recovery_step and its return type in src/domain");
    let opening = format!("pub enum {enum_name} {{");
    let body = sources
        .iter()
        .find_map(|source| {
            let after = &source[source.find(&opening)? + opening.len()..];
            Some(after[..after.find("\n}")?].to_owned())
        })
        .unwrap_or_else(|| panic!("enum {enum_name} in src/domain"));
    body.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with("//") && !line.starts_with("#["))
        .map(|line| line.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>())
        .filter(|name| name.starts_with(|c: char| c.is_ascii_uppercase()))
        .collect()
}

/// Every `MARKER(name)` in the model whose marker is not the tail of a longer word (so that
/// `CRASH(` does not match inside `LEFT_OUT_CRASH(`); the `#define` lines are not markers.
fn model_markers(model: &str, marker: &str) -> BTreeSet<String> {
    let opening = format!("{marker}(");
    let mut names = BTreeSet::new();
    for line in model.lines().filter(|line| !line.trim_start().starts_with("#define")) {
        for (at, _) in line.match_indices(&opening) {
            let before = line[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &line[at + opening.len()..];
            if let Some(end) = rest.find(')') {
                names.insert(rest[..end].trim().to_owned());
            }
        }
    }
    names
}

fn model_names(model: &str) -> ModelNames {
    ModelNames {
        crash_points: model_markers(model, "CRASH"),
        left_out_crash_points: model_markers(model, "LEFT_OUT_CRASH"),
        recovery_steps: model_markers(model, "STEP"),
        left_out_recovery_steps: model_markers(model, "LEFT_OUT_STEP"),
    }
}

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn model_path() -> PathBuf {
    repository().join("model/chargeguard.pml")
}

fn rust_sources(directory: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(directory).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_sources(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
}

fn read_sources(directory: &Path) -> Vec<String> {
    let mut paths = Vec::new();
    rust_sources(directory, &mut paths);
    paths.sort();
    paths.iter().map(|path| std::fs::read_to_string(path).unwrap()).collect()
}

fn code_names() -> CodeNames {
    let source = repository().join("src");
    let crash_points = read_sources(&source)
        .iter()
        .flat_map(|text| crash_point_calls(text))
        .chain(crash_point_table(&std::fs::read_to_string(source.join("failpoints.rs")).unwrap()))
        .collect();
    let recovery_steps = recovery_steps(&read_sources(&source.join("domain"))).into_iter().collect();
    CodeNames { crash_points, recovery_steps }
}

#[test]
fn the_model_names_every_crash_point_and_recovery_step_of_the_code_and_nothing_else() {
    let code = code_names();
    assert!(code.crash_points.contains("charge.after_pending_commit"), "{code:?}");
    assert!(code.crash_points.contains("charge.after_record"), "points named through a parameter: {code:?}");
    assert!(code.recovery_steps.contains("ResendCreate"), "{code:?}");
    let model = model_names(&std::fs::read_to_string(model_path()).unwrap());
    assert_eq!(drift(&code, &model), Vec::<String>::new());
}

#[test]
fn the_drift_check_fails_when_the_code_gains_a_crash_point_or_a_step_the_model_lacks() {
    let mut code = code_names();
    let model = model_names(&std::fs::read_to_string(model_path()).unwrap());
    code.crash_points.insert("charge.after_new_place".to_owned());
    code.recovery_steps.insert("AskTheCustomer".to_owned());
    assert_eq!(
        drift(&code, &model),
        vec![
            "crash point charge_after_new_place is in the code but the model neither models it nor lists it as left out",
            "recovery step AskTheCustomer is in the code but the model neither models it nor lists it as left out",
        ]
    );
    // A call site, not only the table, is enough for the extraction to see a new point.
    let added = "fn f() { crate::failpoints::crash_point(\"sweep.before_claim\"); }";
    assert_eq!(crash_point_calls(added), vec!["sweep.before_claim"]);
}

#[test]
fn the_drift_check_fails_when_the_model_names_what_the_code_does_not_have() {
    let code = code_names();
    let text = std::fs::read_to_string(model_path()).unwrap() + "\n/* CRASH(round_before_provider_call) */\n";
    assert_eq!(
        drift(&code, &model_names(&text)),
        vec!["crash point round_before_provider_call is named by the model but does not exist in the code"]
    );
}

/// Checks the model with spin in a temporary directory and returns pan's report. `liveness`
/// compiles the LTL property and searches for acceptance cycles under weak fairness.
fn pan(defines: &[&str], liveness: bool) -> String {
    let directory = tempfile::tempdir().unwrap();
    let run = |program: &str, arguments: &[&str]| {
        let output = Command::new(program)
            .args(arguments)
            .current_dir(directory.path())
            .output()
            .unwrap_or_else(|error| panic!("{program} could not run ({error}); .ci/run installs spin (ensure_spin)"));
        let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success() || program == "./pan", "{program} {arguments:?} failed:\n{text}");
        text
    };
    let model = model_path();
    let mut spin_arguments = vec!["-a"];
    if liveness {
        spin_arguments.push("-DLIVENESS");
    }
    spin_arguments.extend(defines);
    spin_arguments.push(model.to_str().unwrap());
    run("spin", &spin_arguments);
    // MEMLIM stops a search that outgrows a shared machine instead of swapping it to death;
    // NFAIR makes room for weak fairness over all the model's processes.
    let mut gcc_arguments = vec!["-O2", "-w", "-DMEMLIM=4096", "-DNFAIR=4", "-o", "pan", "pan.c"];
    if !liveness {
        gcc_arguments.insert(0, "-DSAFETY");
    }
    run("gcc", &gcc_arguments);
    let pan_arguments: &[&str] = if liveness { &["-a", "-f", "-m1000000"] } else { &["-m1000000"] };
    run("./pan", pan_arguments)
}

/// The search covered every state: nothing cut off by depth or memory.
fn assert_complete(report: &str) {
    assert!(!report.contains("max search depth too small"), "{report}");
    assert!(!report.contains("out of memory"), "{report}");
    assert!(!report.contains("MEMLIM"), "{report}");
}

#[test]
fn spin_finds_no_violation_of_the_safety_properties() {
    let report = pan(&[], false);
    assert_complete(&report);
    assert!(report.contains("errors: 0"), "{report}");
}

#[test]
fn spin_finds_every_accepted_attempt_ending_once_faults_stop() {
    // The liveness search (acceptance cycles under weak fairness) is bounded at one delivery
    // here to keep CI near a minute; model/check.sh --large runs two.
    let report = pan(&["-DN=1"], true);
    assert_complete(&report);
    assert!(report.contains("errors: 0"), "{report}");
}

#[test]
fn spin_finds_the_double_charge_from_clock_skew_in_the_code_before_issue_14() {
    // The whole pre-fix model fails some assertion; the clock alone, with the retention
    // assertion off, fails with the second charge itself.
    let report = pan(&["-DPREFIX"], false);
    assert!(report.contains("assertion violated"), "{report}");
    let report = pan(&["-DPREFIX_CLOCK", "-DNO_RETENTION_ASSERT"], false);
    assert!(report.contains("assertion violated (charges<=1)"), "{report}");
    let report = pan(&["-DPREFIX_CLOCK"], false);
    assert!(report.contains("assertion violated ( !(key_used)||(now<(key_first+5)))"), "{report}");
}

#[test]
fn spin_finds_the_lapsed_lease_answered_applied_and_the_parked_row_before_issue_14() {
    let report = pan(&["-DPREFIX_LEASE"], false);
    assert!(report.contains("assertion violated ((((ans==3)||(ans==0))"), "{report}");
    let report = pan(&["-DPREFIX_PARK", "-DN=1", "-DFAULTS=2", "-DTMAX=4"], true);
    assert!(report.contains("acceptance cycle"), "{report}");
}

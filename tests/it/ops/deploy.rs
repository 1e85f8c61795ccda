//! deploy/ checked offline (there is no Docker engine or cluster here): every YAML file parses,
//! the Kubernetes objects have what operations rely on (gRPC health probes, a migration Job,
//! Secrets referenced and never inlined), image names agree, and the Dockerfile builds with the
//! README's command as a non-root multi-stage image.

use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const README: &str = include_str!("../../../README.md");

fn image() -> String {
    format!("chargeguard:{}", env!("CARGO_PKG_VERSION"))
}

/// Every file under `dir`, at any depth, whose extension is one of `extensions`.
pub(super) fn files_under(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_under(&path, extensions));
        } else if path
            .extension()
            .is_some_and(|ext| extensions.iter().any(|wanted| ext == *wanted))
        {
            found.push(path);
        }
    }
    found
}

/// Every document of every YAML file under deploy/, with the file it came from.
fn documents() -> Vec<(PathBuf, Yaml)> {
    let files = files_under(&Path::new(ROOT).join("deploy"), &["yaml", "yml"]);
    assert!(!files.is_empty());
    files
        .into_iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let docs = YamlLoader::load_from_str(&text)
                .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            docs.into_iter().map(move |doc| (path.clone(), doc))
        })
        .collect()
}

fn kind(doc: &Yaml) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn of_kind<'a>(docs: &'a [(PathBuf, Yaml)], wanted: &str) -> Vec<&'a Yaml> {
    docs.iter()
        .map(|(_, doc)| doc)
        .filter(|doc| kind(doc) == wanted)
        .collect()
}

fn strings(list: &Yaml) -> Vec<&str> {
    list.as_vec()
        .map(|items| items.iter().filter_map(Yaml::as_str).collect())
        .unwrap_or_default()
}

/// Pod templates of Deployments, Jobs and CronJobs.
fn pod_specs(doc: &Yaml) -> Vec<&Yaml> {
    match kind(doc) {
        "Deployment" | "Job" => vec![&doc["spec"]["template"]["spec"]],
        "CronJob" => vec![&doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]],
        _ => vec![],
    }
}

fn looks_secret(name: &str) -> bool {
    // A `…_FILE` variable names where a secret is read from, not the secret.
    !name.ends_with("_FILE")
        && ["PASSWORD", "API_KEY", "TOKEN", "SECRET", "DATABASE__URL", "DATABASE_URL", "CONSUMERS"]
            .iter()
            .any(|word| name.contains(word))
}

#[test]
fn every_yaml_file_parses_and_kubernetes_objects_are_complete() {
    let docs = documents();
    for (path, doc) in &docs {
        assert!(
            !doc.is_badvalue() && !doc.is_null(),
            "{} has an empty document",
            path.display()
        );
    }
    let k8s: Vec<(PathBuf, Yaml)> = docs
        .iter()
        .filter(|(path, _)| path.starts_with(Path::new(ROOT).join("deploy/k8s")))
        .cloned()
        .collect();
    for (path, doc) in &k8s {
        let kind = kind(doc);
        assert!(!kind.is_empty(), "{}: no kind", path.display());
        if kind != "Kustomization" {
            assert!(
                doc["apiVersion"].as_str().is_some(),
                "{}: no apiVersion",
                path.display()
            );
            assert!(
                doc["metadata"]["name"].as_str().is_some(),
                "{}: no metadata.name",
                path.display()
            );
        }
        assert_ne!(
            kind,
            "Secret",
            "{}: Secrets are created outside the manifests, never inlined",
            path.display()
        );
    }

    let deployments = of_kind(&k8s, "Deployment");
    assert_eq!(deployments.len(), 1);
    let pod = &deployments[0]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let grpc_port = container["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|port| port["name"].as_str() == Some("grpc"))
        .unwrap()["containerPort"]
        .as_i64()
        .unwrap();
    // The kubelet's gRPC probe cannot speak TLS: the probes are HTTPS on the HTTP port.
    let readiness = &container["readinessProbe"]["httpGet"];
    let liveness = &container["livenessProbe"]["httpGet"];
    for (probe, path, why) in [
        (readiness, "/readyz", "ready means the database answers"),
        (liveness, "/healthz", "a database outage must not restart pods"),
    ] {
        assert_eq!(probe["port"].as_str(), Some("http"), "{why}");
        assert_eq!(probe["scheme"].as_str(), Some("HTTPS"), "the HTTP port speaks TLS");
        assert_eq!(probe["path"].as_str(), Some(path), "{why}");
    }
    let tls_mount = container["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|mount| mount["name"].as_str() == Some("tls"))
        .expect("the TLS Secret is mounted");
    assert!(tls_mount["subPath"].is_badvalue(), "mounted whole, so renewals reach the files");
    let tls_volume = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|volume| volume["name"].as_str() == Some("tls"))
        .unwrap();
    assert!(tls_volume["secret"]["secretName"].as_str().is_some(), "from a Secret");
    let grace_s = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
    let config_map = of_kind(&k8s, "ConfigMap");
    let toml_text = config_map[0]["data"]["chargeguard.toml"].as_str().unwrap();
    let config: chargeguard::config::Config =
        toml::from_str(toml_text).expect("the ConfigMap's chargeguard.toml is a valid Config");
    config.validate().unwrap();
    assert!(
        (grace_s as u64) * 1_000 > config.server.shutdown_grace_ms,
        "the pod outlives the drain"
    );
    assert_eq!(config.server.grpc_listen.port() as i64, grpc_port);
    // Prometheus scrapes the plaintext metrics listener: the HTTP port speaks TLS.
    let annotations = &deployments[0]["spec"]["template"]["metadata"]["annotations"];
    let scraped_port: u16 = annotations["prometheus.io/port"].as_str().unwrap().parse().unwrap();
    let metrics_listen = config.server.metrics_listen.expect("metrics on a listener of their own");
    assert_eq!(metrics_listen.port(), scraped_port, "the scrape annotation names server.metrics_listen");
    assert!(
        container["ports"].as_vec().unwrap().iter().any(|port| port["containerPort"].as_i64() == Some(scraped_port as i64)),
        "the container declares the metrics port"
    );
    let mount = tls_mount["mountPath"].as_str().unwrap();
    for file in [&config.server.tls_cert_file, &config.server.tls_key_file] {
        let file = file.as_ref().expect("TLS is configured");
        assert!(file.starts_with(mount), "{} is in the mounted Secret {mount}", file.display());
    }
    assert!(config.server.require_tls, "no plaintext on a pod address");
    assert!(
        !config.database.migrate_on_start,
        "the Job migrates, replicas do not race to"
    );

    let services = of_kind(&k8s, "Service");
    assert!(
        services[0]["spec"]["ports"]
            .as_vec()
            .unwrap()
            .iter()
            .any(|port| port["port"].as_i64() == Some(grpc_port))
    );
    let jobs = of_kind(&k8s, "Job");
    assert!(jobs.iter().any(|job| strings(
        &job["spec"]["template"]["spec"]["containers"][0]["args"]
    ) == ["migrate"]));
    let cron_jobs = of_kind(&k8s, "CronJob");
    let sweep_args = strings(
        &cron_jobs[0]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"],
    );
    assert!(sweep_args.ends_with(&["sweep", "--once"]), "{sweep_args:?}");

    for (path, doc) in &k8s {
        for pod in pod_specs(doc) {
            assert_eq!(
                pod["securityContext"]["runAsNonRoot"].as_bool(),
                Some(true),
                "{}",
                path.display()
            );
            for container in pod["containers"].as_vec().unwrap() {
                assert_eq!(
                    container["image"].as_str(),
                    Some(image().as_str()),
                    "{}",
                    path.display()
                );
                for env in container["env"].as_vec().into_iter().flatten() {
                    let name = env["name"].as_str().unwrap();
                    if looks_secret(name) {
                        assert!(
                            env["value"].is_badvalue(),
                            "{}: {name} is inlined",
                            path.display()
                        );
                        assert!(
                            env["valueFrom"]["secretKeyRef"]["name"].as_str().is_some(),
                            "{}: {name} must come from a Secret",
                            path.display()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn compose_runs_postgres_chargeguard_the_simulator_and_the_example_consumer_with_secrets_from_the_environment() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("deploy/docker-compose.yml")).unwrap();
    let compose = &YamlLoader::load_from_str(&text).unwrap()[0];
    let services = &compose["services"];
    assert!(
        services["postgres"]["image"]
            .as_str()
            .unwrap()
            .starts_with("postgres:")
    );
    let simulator = &services["stripe-sim"];
    let chargeguard = &services["chargeguard"];
    assert_eq!(simulator["image"].as_str(), Some(image().as_str()));
    assert_eq!(chargeguard["image"].as_str(), Some(image().as_str()));
    assert_eq!(strings(&simulator["command"])[0], "stripe-sim");
    assert_eq!(strings(&chargeguard["command"]), ["serve"]);
    assert_eq!(
        simulator["build"]["dockerfile"].as_str(),
        Some("deploy/Dockerfile")
    );
    let base_url = chargeguard["environment"]["CHARGEGUARD_PROVIDER__BASE_URL"]
        .as_str()
        .unwrap();
    assert!(base_url.starts_with("http://stripe-sim:"), "{base_url}");
    assert!(
        base_url.ends_with('/'),
        "async-stripe needs the trailing slash: {base_url}"
    );
    // The example consumer: the image's second binary, its token from a secret file, never
    // from the environment.
    assert!(services["rabbitmq"]["image"].as_str().unwrap().starts_with("rabbitmq:"));
    let consumer = &services["order-consumer"];
    assert_eq!(consumer["image"].as_str(), Some(image().as_str()));
    assert_eq!(strings(&consumer["entrypoint"]), ["/usr/local/bin/order-consumer"]);
    assert_eq!(strings(&consumer["command"]), ["run"]);
    assert_eq!(consumer["environment"]["ORDER_CONSUMER_TOKEN_FILE"].as_str(), Some("/run/secrets/orders_token"));
    assert_eq!(compose["secrets"]["orders_token"]["file"].as_str(), Some("./orders.token"));
    for service in ["postgres", "chargeguard", "order-consumer", "grafana"] {
        let environment = services[service]["environment"].as_hash().unwrap();
        for (name, value) in environment {
            let (name, value) = (name.as_str().unwrap(), value.as_str().unwrap_or_default());
            if looks_secret(name) {
                assert!(
                    value.contains("${"),
                    "{service}: {name} must come from the environment, not the file"
                );
            }
        }
    }
}

/// The compose layout's monitoring: Prometheus scrapes chargeguard's HTTP port and loads the
/// alerting rules from the mounted deploy/prometheus/ (promtool checks that configuration in
/// `ops::alerts`); Grafana is provisioned with that Prometheus and the dashboard.
#[test]
fn compose_monitors_chargeguard_with_the_alerting_rules_and_the_dashboard() {
    let deploy = Path::new(ROOT).join("deploy");
    let load = |file: &str| YamlLoader::load_from_str(&std::fs::read_to_string(deploy.join(file)).unwrap()).unwrap().remove(0);
    let compose = load("docker-compose.yml");
    let services = &compose["services"];

    let prometheus = &services["prometheus"];
    assert!(strings(&prometheus["volumes"]).contains(&"./prometheus:/etc/prometheus:ro"));
    assert!(strings(&prometheus["command"]).contains(&"--config.file=/etc/prometheus/prometheus.yml"));
    let config = load("prometheus/prometheus.yml");
    assert_eq!(strings(&config["rule_files"]), ["alerts.yml"]);
    let job = &config["scrape_configs"][0];
    assert_eq!(job["job_name"].as_str(), Some("chargeguard"));
    // The HTTP port, where /metrics is: the container's 8080 (README "Deploy").
    assert_eq!(strings(&job["static_configs"][0]["targets"]), ["chargeguard:8080"]);
    assert!(strings(&services["chargeguard"]["ports"]).iter().any(|mapping| mapping.ends_with(":8080")));

    let grafana = &services["grafana"];
    let volumes = strings(&grafana["volumes"]);
    assert!(volumes.contains(&"./grafana/provisioning:/etc/grafana/provisioning:ro"), "{volumes:?}");
    let dashboard_mount = volumes
        .iter()
        .find_map(|volume| volume.strip_prefix("./grafana/chargeguard.json:"))
        .expect("the dashboard is mounted");
    let dashboards = load("grafana/provisioning/dashboards/chargeguard.yml");
    let dashboards_path = dashboards["providers"][0]["options"]["path"].as_str().unwrap();
    assert!(dashboard_mount.starts_with(&format!("{dashboards_path}/")), "{dashboard_mount} outside {dashboards_path}");
    let datasources = load("grafana/provisioning/datasources/prometheus.yml");
    let datasource = &datasources["datasources"][0];
    assert_eq!(datasource["type"].as_str(), Some("prometheus"));
    let prometheus_port = strings(&prometheus["ports"])[0].rsplit(':').next().unwrap().to_owned();
    assert_eq!(datasource["url"].as_str(), Some(format!("http://prometheus:{prometheus_port}").as_str()));
}

/// The command in the code block after `<!-- build-command -->` in the README.
fn readme_build_command() -> &'static str {
    let (_, after) = README
        .split_once("<!-- build-command -->")
        .expect("README marks its build command");
    after
        .lines()
        .skip_while(|line| !line.starts_with("```"))
        .nth(1)
        .unwrap()
        .trim()
}

#[test]
fn the_dockerfile_builds_with_the_readme_command_into_a_non_root_runtime_stage() {
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("deploy/Dockerfile")).unwrap();
    let instructions: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    let stages: Vec<usize> = instructions
        .iter()
        .enumerate()
        .filter(|(_, line)| line.starts_with("FROM "))
        .map(|(i, _)| i)
        .collect();
    assert!(stages.len() >= 2, "multi-stage");
    let (build, runtime) = instructions.split_at(*stages.last().unwrap());
    let build_command = readme_build_command();
    assert!(
        build_command.starts_with("cargo build --release"),
        "{build_command}"
    );
    assert!(
        build.contains(&format!("RUN {build_command}").as_str()),
        "the build stage runs `{build_command}`"
    );
    assert!(runtime.iter().any(
        |line| line.starts_with("COPY --from=") && line.contains("target/release/chargeguard")
    ));
    let user = runtime
        .iter()
        .rev()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("the runtime stage sets a user");
    let uid = user.split(':').next().unwrap();
    assert!(uid != "root" && uid != "0", "runs as {user}");
    assert!(
        runtime
            .iter()
            .any(|line| line.starts_with("ENTRYPOINT") && line.contains("chargeguard"))
    );
    assert!(
        !runtime.iter().any(|line| line.starts_with("RUN cargo")),
        "no toolchain in the runtime image"
    );
}

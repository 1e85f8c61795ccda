#!/usr/bin/env python3
"""Prints the figures of one bench/run.sh run, the service/pgbench ratios and the targets of
BENCHMARKS.md, and writes them to summary.json. Reads only the run's output folder, so it can be
run again on an old one: python3 bench/summary.py target/bench-run"""

import glob
import json
import os
import sys

TARGET_THROUGHPUT_RATIO = 0.7
TARGET_GROUP_COMMIT_RATIO = 1.0
TARGET_ADDED_P99_MS = 5.0
TARGET_PEAK_RSS_MIB = 64.0
TARGET_SWEEP_GROWTH = 1.2


def main(out):
    run = dict(line.rstrip("\n").split("=", 1) for line in open(os.path.join(out, "run.env")) if "=" in line)

    def load(name):
        path = os.path.join(out, name)
        if not os.path.exists(path):
            return None
        with open(path) as file:
            return next(iter(json.load(file).values()))

    def pgbench_tps(label):
        with open(os.path.join(out, f"pgbench-{label}.log")) as file:
            for line in file:
                if line.startswith("tps = "):
                    return float(line.split()[2])
        raise SystemExit(f"no tps in pgbench-{label}.log")

    new, duplicate, latency = load("service-new.json"), load("service-duplicate.json"), load("service-new-latency.json")
    ceiling = load("service-grpc-ceiling.json")
    uncached = load("service-duplicate-uncached.json")
    provider_alone = load("service-provider-latency.json")
    pg_new, pg_by_key = pgbench_tps("new"), pgbench_tps("by-key")
    sim_latency_ms = float(run["sim_latency_ms"])
    rss_mib = int(run["peak_rss_kib"]) / 1024
    rows = {"small": int(run["sweep_rows_small"]), "large": int(run["sweep_rows_large"])}

    print(f"chargeguard benchmark, {run['scale']} scale: commit {run['commit']} on {run['host']}")
    print(f"machine: {run['cpu']}, {run['memory_gib']} GiB, Linux {run['kernel']}; load average at the end {run['load_average_at_end']}")
    print(f"PostgreSQL {run['postgres']}: {run['postgres_settings']}")
    print(f"concurrency {run['concurrency']} ({run['connections']} gRPC connections); {run['seconds_measured']} s measured "
          f"after {run['seconds_warmup']} s warm-up per row; {run['charge_table_rows']} rows in the table before; "
          f"{build_phrase(run)}, measuring {run.get('measuring_seconds', '?')} s, "
          f"whole run {run['total_seconds']} s")
    print()
    print(f"{'':36}{'per second':>11}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}")

    def row(name, report):
        l = report["latency_ms"]
        print(f"{name:36}{report['ok_per_second']:11.1f}{l['p50']:9.2f}{l['p99']:9.2f}{l['p999']:10.2f}")

    print(f"{'pgbench, new-charge SQL':36}{pg_new:11.1f}")
    row("chargeguard new, simulator 0 ms", new)
    row(f"chargeguard new, simulator {sim_latency_ms:g} ms", latency)
    if provider_alone:
        row(f"the simulator alone at {sim_latency_ms:g} ms", provider_alone)
    # Per transaction: client, number, latency µs, script, epoch s, µs, schedule lag µs. With -R the
    # latency counts from the scheduled start; minus the lag it is the SQL's own time, as the load
    # generator measures a call. Each client's first transaction also prepares the statements.
    at_rate = sorted((int(f[2]) - int(f[6])) / 1000
                     for path in glob.glob(os.path.join(out, "pgbench-at-rate.*"))
                     for f in (line.split() for line in open(path)) if len(f) >= 7 and f[1] != "1")
    sql_at_rate = None
    if at_rate:
        sql_at_rate = {"per_second": pgbench_tps("new-at-rate"), "p50": at_rate[len(at_rate) // 2],
                       "p99": at_rate[min(len(at_rate) - 1, int(len(at_rate) * 0.99))],
                       "p999": at_rate[min(len(at_rate) - 1, int(len(at_rate) * 0.999))]}
        print(f"{'pgbench, new-charge SQL, same rate':36}{sql_at_rate['per_second']:11.1f}{sql_at_rate['p50']:9.2f}"
              f"{sql_at_rate['p99']:9.2f}{sql_at_rate['p999']:10.2f}")
    print(f"{'pgbench, select by key':36}{pg_by_key:11.1f}")
    row("chargeguard duplicates", duplicate)
    if uncached:
        row("chargeguard duplicates, cache off", uncached)
    if ceiling:
        row("gRPC health check (ceiling)", ceiling)
    reports = [("new", new), ("duplicates", duplicate), (f"new at {sim_latency_ms:g} ms", latency)]
    if uncached:
        reports.append(("duplicates, cache off", uncached))
    errors = sum(report["errors"] for _, report in reports)
    for name, report in reports:
        print(f"outcomes, {name}: " + ", ".join(f"{k} {v}" for k, v in report["outcomes"].items()))
    print(f"service peak RSS (VmHWM over the service runs with the default configuration): {rss_mib:.1f} MiB")

    sweep = {}
    for size in ("small", "large"):
        claim, swept = load(f"claim-{size}.json"), load(f"sweep-{size}.json")
        if claim:
            sweep[size] = {
                "table_rows": rows[size],
                "stuck_rows": claim["rows_claimed"],
                "claim_ms_per_1000": claim["ms_per_thousand_rows"],
                "sweep_ms_per_1000": swept["ms_per_thousand_rows"] if swept else None,
            }
            whole = f"sweep --once {swept['ms_per_thousand_rows']} ms" if swept else "sweep --once: not in this build"
            print(f"sweep, {claim['rows_claimed']} stuck rows in {rows[size]:,} rows: claim query "
                  f"{claim['ms_per_thousand_rows']} ms per 1,000 stuck rows; {whole}")
    if rows["large"] < int(run["sweep_rows_large_asked"]):
        print(f"(the large sweep table was {rows['large']:,} rows, not the {int(run['sweep_rows_large_asked']):,} asked: "
              "the time left allowed no more)" if rows["large"] else "(no time was left for a larger sweep table)")

    checks = []

    def check(name, value, goal, met):
        checks.append({"target": name, "value": value, "goal": goal, "met": met})

    ratio_new = new["ok_per_second"] / pg_new
    ratio_duplicate = duplicate["ok_per_second"] / pg_by_key
    # "Over the simulator's own latency": measured at the same setting and concurrency when the
    # run has it (a 20 ms sleep in the simulator takes ~21-22 ms), else the configured figure.
    sim_own_p99 = provider_alone["latency_ms"]["p99"] if provider_alone else sim_latency_ms
    added_p99 = latency["latency_ms"]["p99"] - sim_own_p99
    check("new charges / pgbench same SQL", round(ratio_new, 3), f">= {TARGET_THROUGHPUT_RATIO}", ratio_new >= TARGET_THROUGHPUT_RATIO)
    check("duplicates / pgbench select by key", round(ratio_duplicate, 3), f">= {TARGET_THROUGHPUT_RATIO}",
          ratio_duplicate >= TARGET_THROUGHPUT_RATIO)
    check(f"p99 over the simulator's own p99 ({sim_own_p99:.2f} ms at {sim_latency_ms:g} ms), ms", round(added_p99, 2),
          f"<= {TARGET_ADDED_P99_MS:g}", added_p99 <= TARGET_ADDED_P99_MS)
    check("service peak RSS, MiB", round(rss_mib, 1), f"<= {TARGET_PEAK_RSS_MIB:g}", rss_mib <= TARGET_PEAK_RSS_MIB)
    if "small" in sweep and "large" in sweep:
        for kind, key in (("claim query", "claim_ms_per_1000"), ("sweep --once", "sweep_ms_per_1000")):
            small, large = sweep["small"][key], sweep["large"][key]
            if small and large:
                growth = large / small
                check(f"{kind} per 1,000 stuck rows, {rows['large']:,} / {rows['small']:,} rows", round(growth, 3),
                      f"<= {TARGET_SWEEP_GROWTH}", growth <= TARGET_SWEEP_GROWTH)

    cpu = cpu_table(out, load, pgbench_tps)
    if cpu:
        print()
        print("CPU per call, µs (whole invocation, warm-up included; a row's rate x its wall time = its calls):")
        print(f"{'':36}{'postgres':>10}{'service':>10}{'simulator':>10}{'client':>10}{'total':>10}")
        for name, row_cpu in cpu.items():
            cells = "".join(f"{row_cpu[k]:10.0f}" if row_cpu[k] is not None else f"{'-':>10}"
                            for k in ("postgres", "service", "simulator", "client", "total"))
            print(f"{name:36}{cells}")

    print()
    print("ratios and targets:")
    for c in checks:
        print(f"  {'met ' if c['met'] else 'MISS'}  {c['target']}: {c['value']} (target {c['goal']})")
    if sql_at_rate:
        print(f"  note  for comparison, the same SQL alone at the same rate (pgbench -R): p50 {sql_at_rate['p50']:.2f} ms, "
              f"p99 {sql_at_rate['p99']:.2f} ms (two durable commits per charge)")
    if provider_alone:
        added_p50 = latency["latency_ms"]["p50"] - provider_alone["latency_ms"]["p50"]
        print(f"  note  p50 over the simulator's own p50: {added_p50:.2f} ms; p99 over the configured {sim_latency_ms:g} ms: "
              f"{latency['latency_ms']['p99'] - sim_latency_ms:.2f} ms")
    if ceiling:
        c = ceiling["ok_per_second"]
        print(f"  note  a unary gRPC call that does nothing reaches {c:.0f}/s here = {c / pg_by_key:.2f} x pgbench select by key; "
              f"duplicates reach {duplicate['ok_per_second'] / c:.2f} and new charges {new['ok_per_second'] / c:.2f} of it")
    if uncached:
        u = uncached["ok_per_second"]
        print(f"  note  duplicates with the outcome cache off (each reads the database): {u:.0f}/s = {u / pg_by_key:.2f} x "
              f"pgbench select by key; the cache answers {duplicate['ok_per_second'] / u:.2f} x as many")
    if errors:
        print(f"  note  {errors} calls failed (see the outcomes above)")

    group_commit = group_commit_table(out, run, load, pgbench_tps, provider_alone, sim_latency_ms)

    with open(os.path.join(out, "summary.json"), "w") as file:
        json.dump({
            "run": run, "pgbench_new_tps": pg_new, "pgbench_by_key_tps": pg_by_key,
            "service_new": new, "service_duplicate": duplicate, "service_duplicate_uncached": uncached, "service_new_latency": latency,
            "pgbench_new_at_rate": sql_at_rate, "service_grpc_ceiling": ceiling, "provider_alone": provider_alone, "cpu_per_call_us": cpu, "peak_rss_mib": rss_mib, "sweep": sweep, "checks": checks,
            "group_commit": group_commit,
        }, file, indent=1)


def build_phrase(run):
    # Under BENCH_BIN the script builds nothing: name the binary rather than a 0 s build.
    if run.get("bench_bin"):
        return f"binary {run['bench_bin']} (nothing built)"
    return f"release build {run['build_seconds']} s"


def cpu_per_call(out, label, rate):
    """CPU microseconds per call of each process group in one timed row, or None."""
    path = os.path.join(out, f"cpu-{label}.json")
    if not os.path.exists(path):
        return None
    with open(path) as file:
        c = json.load(file)
    calls = rate * c["wall_seconds"]
    if calls <= 0:
        return None
    per = lambda ticks: ticks / c["ticks_per_second"] / calls * 1e6
    row = {"postgres": per(c["postgres_ticks"]),
           "service": per(c["service_ticks"]) if label.startswith("service") else None,
           "simulator": per(c["simulator_ticks"]) if label.startswith("service") else None,
           "client": c["client_seconds"] / calls * 1e6 if c["client_seconds"] is not None else None}
    row["total"] = sum(v for v in row.values() if v is not None)
    # The WAL the row wrote, per call (runs before the checkpoint per row did not record it).
    row["wal_bytes"] = c["wal_bytes"] / calls if "wal_bytes" in c else None
    row["wal_fpi"] = c["wal_fpi"] / calls if "wal_fpi" in c else None
    return row


def group_commit_table(out, run, load, pgbench_tps, provider_alone, sim_latency_ms):
    """Issue 21: new charges with group commit on and off against pgbench, side by side."""
    concurrencies = run.get("group_commit_concurrency", "").split()
    if not concurrencies:
        return None
    print()
    print("group commit side by side (one service per row, pool = callers):")
    print(f"{'':40}{'per second':>11}{'/ pgbench':>10}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'pg µs':>8}{'svc µs':>8}{'sim µs':>8}{'client':>8}{'total':>8}{'WAL B':>7}{'FPI':>6}{'RSS MiB':>9}")
    table = {}
    for c in concurrencies:
        pg = pgbench_tps(f"new-c{c}")
        entry = {"pgbench_tps": pg, "pgbench_cpu_us": cpu_per_call(out, f"pgbench-new-c{c}", pg)}
        cells = entry["pgbench_cpu_us"] or {}
        fmt = lambda v: f"{v:8.0f}" if v is not None else f"{'-':>8}"
        # WAL bytes and full-page images per charge.
        wal = lambda cells: ((f"{cells['wal_bytes']:7.0f}" if cells.get("wal_bytes") is not None else f"{'-':>7}")
                             + (f"{cells['wal_fpi']:6.2f}" if cells.get("wal_fpi") is not None else f"{'-':>6}"))
        print(f"{'pgbench new-charge SQL, ' + c + ' clients':40}{pg:11.1f}{1.0:10.2f}{'':18}"
              + "".join(fmt(cells.get(k)) for k in ("postgres", "service", "simulator", "client", "total"))
              + wal(cells))
        for switch in ("on", "off"):
            report = load(f"service-new-gc-{switch}-c{c}.json")
            if not report:
                continue
            rate = report["ok_per_second"]
            cpu = cpu_per_call(out, f"service-new-gc-{switch}-c{c}", rate) or {}
            rss = load(f"rss-gc-{switch}-c{c}.json")
            rss_mib = rss["kib"] / 1024 if rss else None
            l = report["latency_ms"]
            print(f"{'chargeguard new, group commit ' + switch + ', ' + c:40}{rate:11.1f}{rate / pg:10.2f}"
                  f"{l['p50']:9.2f}{l['p99']:9.2f}"
                  + "".join(fmt(cpu.get(k)) for k in ("postgres", "service", "simulator", "client", "total"))
                  + wal(cpu) + (f"{rss_mib:9.1f}" if rss_mib else ""))
            entry[switch] = {"report": report, "ratio_to_pgbench": rate / pg, "cpu_us": cpu, "peak_rss_mib": rss_mib,
                             "errors": report["errors"], "outcomes": report["outcomes"]}
        table[c] = entry
    sim_own_p99 = provider_alone["latency_ms"]["p99"] if provider_alone else sim_latency_ms
    for switch in ("on", "off"):
        latency = load(f"service-new-latency-gc-{switch}.json")
        if latency:
            # Over the simulator alone measured right after this row when the run has it (runs
            # before the rounds measured it once, earlier in the run).
            adjacent = load("service-provider-latency-gc.json") if switch == "on" else None
            own_p99 = adjacent["latency_ms"]["p99"] if adjacent else sim_own_p99
            added = latency["latency_ms"]["p99"] - own_p99
            print(f"  group commit {switch}, simulator at {sim_latency_ms:g} ms, {run['concurrency']} callers: p99 "
                  f"{latency['latency_ms']['p99']:.2f} ms = {added:+.2f} ms over the simulator's own p99 ({own_p99:.2f} ms); "
                  f"p50 {latency['latency_ms']['p50']:.2f} ms")
            table[f"latency_{switch}"] = {"report": latency, "p99_added_ms": added}
    rounds_table(out, run, load, pgbench_tps, table, concurrencies)
    table["checks"] = group_commit_checks(table, concurrencies)
    floor = non_database_floor(out, load)
    if floor:
        table["non_database_floor_us"] = floor
        print(f"  non-database floor: {floor['total']:.0f} µs of CPU per charge (gRPC call {floor['grpc']:.0f}: service + client; "
              f"provider call {floor['provider']:.0f}: simulator + client), whatever the SQL costs")
        for c in concurrencies:
            pg_total = (table[c]["pgbench_cpu_us"] or {}).get("total")
            if pg_total:
                table[c]["ratio_bound_at_zero_sql_cpu"] = pg_total / floor["total"]
                print(f"  at {c}: pgbench spends {pg_total:.0f} µs per charge in all; with the cores saturated, a charge that "
                      f"costs the floor plus nothing in PostgreSQL could reach at most {pg_total / floor['total']:.2f} × pgbench")
    for c, entry in table.items():
        if isinstance(entry, dict) and "on" in entry and "off" in entry:
            on, off = entry["on"]["report"]["ok_per_second"], entry["off"]["report"]["ok_per_second"]
            print(f"  at {c}: group commit on / off = {on / off:.2f}; on / pgbench = {on / entry['pgbench_tps']:.2f}; "
                  f"off / pgbench = {off / entry['pgbench_tps']:.2f}; failed calls on {entry['on']['errors']}, off {entry['off']['errors']}")
    return table


def group_commit_checks(table, concurrencies):
    """Issue 21's targets, read from the rounds' medians where the run has rounds."""
    checks = []
    for c in concurrencies:
        entry = table.get(c) or {}
        if "on" not in entry:
            continue
        ratio = entry.get("ratio_to_pgbench_median", entry["on"]["ratio_to_pgbench"])
        how = "median of the rounds" if "ratio_to_pgbench_median" in entry else "one row"
        checks.append({"target": f"group commit on / pgbench same SQL at {c} ({how})", "value": round(ratio, 3),
                       "goal": f">= {TARGET_GROUP_COMMIT_RATIO}", "met": ratio >= TARGET_GROUP_COMMIT_RATIO})
    added = table.get("p99_added_median_ms", (table.get("latency_on") or {}).get("p99_added_ms"))
    if added is not None:
        how = "median of the rounds" if "p99_added_median_ms" in table else "one row"
        checks.append({"target": f"group commit on, p99 over the simulator's own, ms ({how})", "value": round(added, 2),
                       "goal": f"<= {TARGET_ADDED_P99_MS:g}", "met": added <= TARGET_ADDED_P99_MS})
    print("  targets of issue 21:")
    for check in checks:
        print(f"    {'met ' if check['met'] else 'MISS'}  {check['target']}: {check['value']} (target {check['goal']})")
    return checks


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def round_suffix(round_number):
    return f"-r{round_number}" if round_number > 1 else ""


def rounds_table(out, run, load, pgbench_tps, table, concurrencies):
    """The side by side's interleaved rounds (pgbench, then group commit on, each round after a
    checkpoint): each round's ratio and p99 added, and their medians, which the targets read."""
    rounds = int(run.get("side_by_side_rounds", "1"))
    if rounds < 2:
        return
    print(f"  {rounds} interleaved rounds (pgbench, then group commit on; the first round is the rows above):")
    for c in concurrencies:
        ratios, rates = [], []
        for r in range(1, rounds + 1):
            report = load(f"service-new-gc-on-c{c}{round_suffix(r)}.json")
            if not report:
                continue
            pg = pgbench_tps(f"new-c{c}{round_suffix(r)}")
            rates.append({"round": r, "pgbench_tps": pg, "on_tps": report["ok_per_second"], "errors": report["errors"]})
            ratios.append(report["ok_per_second"] / pg)
        if not ratios:
            continue
        table[c]["rounds"] = rates
        table[c]["ratio_to_pgbench_median"] = median(ratios)
        print(f"    at {c}: on / pgbench by round " + ", ".join(f"{ratio:.2f}" for ratio in ratios)
              + " (pgbench " + ", ".join(f"{row['pgbench_tps']:.0f}" for row in rates) + "/s); "
              + f"median {median(ratios):.2f}")
    added = []
    for r in range(1, rounds + 1):
        service = load(f"service-new-latency-gc-on{round_suffix(r)}.json")
        alone = load(f"service-provider-latency-gc{round_suffix(r)}.json")
        if service and alone:
            added.append({"round": r, "service_p99_ms": service["latency_ms"]["p99"],
                          "simulator_p99_ms": alone["latency_ms"]["p99"],
                          "p99_added_ms": service["latency_ms"]["p99"] - alone["latency_ms"]["p99"]})
    if added:
        table["latency_on_rounds"] = added
        table["p99_added_median_ms"] = median([row["p99_added_ms"] for row in added])
        print(f"    p99 added at {run['sim_latency_ms']} ms, {run['concurrency']} callers, by round "
              + ", ".join(f"{row['p99_added_ms']:+.2f}" for row in added)
              + f" ms (service p99 less the simulator alone's right after it); median {table['p99_added_median_ms']:+.2f} ms")


def non_database_floor(out, load):
    """CPU µs per charge outside PostgreSQL at the least: a gRPC call (service + client of the
    health-check row) plus a provider call (simulator + client of the simulator-alone row)."""
    grpc_report, provider_report = load("service-grpc-ceiling.json"), load("service-provider-floor.json")
    if not grpc_report or not provider_report:
        return None
    grpc = cpu_per_call(out, "service-grpc-ceiling", grpc_report["ok_per_second"])
    provider = cpu_per_call(out, "service-provider-floor", provider_report["ok_per_second"])
    if not grpc or not provider or grpc["client"] is None or provider["client"] is None:
        return None
    grpc_us = grpc["service"] + grpc["client"]
    provider_us = provider["simulator"] + provider["client"]
    return {"grpc": grpc_us, "provider": provider_us, "total": grpc_us + provider_us}


def cpu_table(out, load, pgbench_tps):
    """CPU microseconds per call of each process group, for the rows bench/run.sh timed."""
    rows = {
        "pgbench, new-charge SQL": ("pgbench-new", lambda: pgbench_tps("new")),
        "chargeguard new, simulator 0 ms": ("service-new", lambda: load("service-new.json")["ok_per_second"]),
        "pgbench, select by key": ("pgbench-by-key", lambda: pgbench_tps("by-key")),
        "chargeguard duplicates": ("service-duplicate", lambda: load("service-duplicate.json")["ok_per_second"]),
        "chargeguard duplicates, cache off": ("service-duplicate-uncached",
                                              lambda: load("service-duplicate-uncached.json")["ok_per_second"]),
        "gRPC health check (ceiling)": ("service-grpc-ceiling", lambda: load("service-grpc-ceiling.json")["ok_per_second"]),
        "simulator alone, 0 ms (provider client)": ("service-provider-floor",
                                                    lambda: load("service-provider-floor.json")["ok_per_second"]),
    }
    table = {}
    for name, (label, rate) in rows.items():
        if not os.path.exists(os.path.join(out, f"cpu-{label}.json")):
            continue
        row = cpu_per_call(out, label, rate())
        if row:
            table[name] = row
    return table


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/bench-run")

"""The summary as two PNGs: a panel per benchmark (rows 1-6), then a panel per group of rows 19-30; bars of medians
(or p99s), the target as a dashed line."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import report

BRIDGE, FLOOR, AGENTPROC, REF = "#2b7bba", "#9e9e9e", "#e08a2b", "#c7c7c7"
BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1}  # a target's label over a bar
COLOURS = {
    "bridge": BRIDGE,
    "subprocess.run": FLOOR,
    "floor": FLOOR,
    "pipe only": FLOOR,
    "agentproc": AGENTPROC,
    "idle (one turn)": FLOOR,
    "python floor": FLOOR,
    "popen": FLOOR,
}


def _bars(
    ax: Any, labels: list[str], values: list[float], fmt: str, colours: list[str] | None = None, boxed: bool = False
) -> None:
    colours = colours or [COLOURS.get(label, BRIDGE) for label in labels]
    bars = ax.bar(labels, values, color=colours)
    for bar, value in zip(bars, values):
        ax.annotate(
            fmt.format(value),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
            bbox=BOX if boxed else None,
        )
    ax.margins(y=0.18)
    ax.tick_params(axis="x", labelsize=8)


def _target(ax: Any, y: float, text: str, left: bool = False, boxed: bool = False) -> None:
    ax.axhline(y, color="#c0392b", linestyle="--", linewidth=1)
    ax.annotate(
        text,
        (0 if left else 1, y),
        xycoords=("axes fraction", "data"),
        ha="left" if left else "right",
        va="bottom",
        fontsize=7,
        color="#c0392b",
        xytext=(2 if left else -2, 1),
        textcoords="offset points",
        bbox=BOX if boxed else None,
    )


def _verdicts(summary: dict[str, Any], prefix: str | tuple[str, ...]) -> str:
    results = [r["result"] for r in summary["rows"] if r["benchmark"].startswith(prefix) and r["result"]]
    return "PASS" if results and all(r == "PASS" for r in results) else ("FAIL" if results else "")


VERDICT_COLOURS = {"PASS": "#1e8449", "FAIL": "#c0392b"}


def _title(ax: Any, text: str, verdict: str, fontsize: float = 10) -> None:
    colour = VERDICT_COLOURS.get(verdict, "black")
    ax.set_title(f"{text}  [{verdict}]" if verdict else text, fontsize=fontsize, color=colour)


def _empty(ax: Any, text: str) -> None:
    ax.set_title(text, fontsize=10)
    ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def draw(summary: dict[str, Any], about: dict[str, Any], path: str) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    ax = axes[0][0]
    if "turn" in summary:
        t = summary["turn"]
        names = ["subprocess.run", "bridge", "agentproc"]
        _bars(ax, names, [t[n]["median"] for n in names], "{:.2f}")
        _target(
            ax, report.TURN_VS_AGENTPROC * t["agentproc"]["median"], f"{report.TURN_VS_AGENTPROC}× agentproc", left=True
        )
        ax.set_ylabel("ms per turn (median)")
        _title(ax, "1 per-turn overhead (lower is better)", _verdicts(summary, "1 "))
    else:
        _empty(ax, "1 per-turn overhead")

    ax = axes[0][1]
    if "throughput" in summary:
        t = summary["throughput"]
        names = [n for n in ("bridge", "agentproc", "python floor") if n in t]
        _bars(ax, names, [t[n]["median"] for n in names], "{:.1f}")
        _target(
            ax,
            report.THROUGHPUT_VS_AGENTPROC * t["agentproc"]["median"],
            f"{report.THROUGHPUT_VS_AGENTPROC:g}× agentproc",
        )
        ax.set_ylabel("MB/s (median)")
        ax.text(
            0.02,
            0.97,
            f"pipe only (no parsing): {t['pipe only']['median']:.0f} MB/s",
            transform=ax.transAxes,
            fontsize=7,
            va="top",
            color="gray",
        )
        _title(
            ax, f"2 throughput, {summary['throughput_mb']:.0f} MB mixed (higher is better)", _verdicts(summary, "2 ")
        )
    else:
        _empty(ax, "2 throughput")

    ax = axes[0][2]
    if "concurrency" in summary:
        c = summary["concurrency"]
        names = [n for n in ("bridge", "agentproc", "popen") if n in c]
        _bars(ax, names, [c[n]["median"] for n in names], "{:.2f} s")
        for i, n in enumerate(names):
            ax.annotate(
                f"{c[n]['failed']} failed",
                (i, 0),
                ha="center",
                va="bottom",
                fontsize=8,
                color="white",
                xytext=(0, 3),
                textcoords="offset points",
            )
        _target(ax, report.CONCURRENCY_WALL_S, f"{report.CONCURRENCY_WALL_S} s")
        ax.axhline(1.0, color="gray", linestyle=":", linewidth=1)
        ax.set_ylabel("wall seconds (median)")
        _title(ax, f"3 {c['bridge']['turns']} × 1 s turns at once", _verdicts(summary, "3 "))
    else:
        _empty(ax, "3 concurrency")

    ax = axes[1][0]
    if "latency" in summary:
        lat = summary["latency"]
        names = [n for n in ("bridge", "agentproc") if n in lat]
        x = range(len(names))
        width = 0.38
        p50 = ax.bar(
            [i - width / 2 for i in x],
            [lat[n]["p50"] for n in names],
            width,
            label="p50",
            color=[COLOURS[n] for n in names],
            alpha=0.55,
        )
        p99 = ax.bar(
            [i + width / 2 for i in x],
            [lat[n]["p99"] for n in names],
            width,
            label="p99",
            color=[COLOURS[n] for n in names],
        )
        for bars in (p50, p99):
            for bar in bars:
                ax.annotate(
                    f"{bar.get_height():.2f}",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
        ax.set_xticks(list(x), [f"{n}\n(p50 | p99)" for n in names], fontsize=8)
        _target(ax, report.LATENCY_P99_MS, f"p99 {report.LATENCY_P99_MS:g} ms")
        ax.margins(y=0.18)
        ax.set_ylabel("ms from write to on_partial")
        _title(ax, "4 partial latency, one every 5 ms", _verdicts(summary, "4 "))
    else:
        _empty(ax, "4 partial latency")

    ax = axes[1][1]
    if "memory" in summary or "concurrency" in summary:
        m = summary.get("memory", {})
        labels = [
            label.split(" ", 2)[-1].replace(", ", "\n") if label[0].isdigit() else label.replace(" (", "\n(")
            for label in m
        ]
        values = [v["max"] for v in m.values()]
        colours = [FLOOR if label.startswith("idle") else BRIDGE for label in m]
        if "concurrency" in summary:
            labels.append(f"{summary['concurrency']['bridge']['turns']} in\nflight")
            values.append(summary["concurrency"]["bridge"]["rss"]["max"])
            colours.append(BRIDGE)
        _bars(ax, labels, values, "{:.0f}", colours)
        ax.tick_params(axis="x", labelsize=7)
        _target(ax, report.PEAK_RSS_MB, f"{report.PEAK_RSS_MB:g} MB")
        ax.set_ylabel("bridge peak RSS, MB (worst sample)")
        flood = next((label.split(" ", 2) for label in m if label[0].isdigit()), None)
        _title(
            ax,
            f"5 memory: {flood[0]} {flood[1]} through one turn; turns in flight" if flood else "5 memory",
            _verdicts(summary, "5 "),
        )
    else:
        _empty(ax, "5 memory")

    ax = axes[1][2]
    if "cli" in summary:
        c = summary["cli"]
        names = ["floor", "bridge", "agentproc"]
        _bars(ax, names, [c[n]["median"] for n in names], "{:.0f}")
        ax.set_xticks(range(3), ["floor\n(imports + agent)", "agent-bridge run", "agentproc CLI"], fontsize=8)
        _target(ax, report.CLI_VS_FLOOR * c["floor"]["median"], f"{report.CLI_VS_FLOOR}× floor")
        ax.set_ylabel("ms (median)")
        _title(ax, "6 CLI cold start", _verdicts(summary, "6 "))
    else:
        _empty(ax, "6 CLI cold start")

    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (BRIDGE, FLOOR, AGENTPROC)]
    fig.legend(
        handles,
        ["agent-bridge", "floor / reference", "agentproc 0.4.2"],
        loc="lower center",
        ncol=3,
        fontsize=9,
        frameon=False,
    )
    quick = "  —  QUICK run, not for comparison" if summary.get("quick") else ""
    fig.suptitle(
        f"agent-bridge benchmarks (dashed red: issue-4 target){quick}\n{report.machine_line(about)}", fontsize=10
    )
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _target_over(ax: Any, first: int, last: int, y: float, text: str) -> None:
    """A target that holds only for the bars first..last: a dashed segment over them, its label at its right end."""
    ax.hlines(y, first - 0.45, last + 0.45, color="#c0392b", linestyle="--", linewidth=1)
    ax.annotate(
        text,
        (last + 0.45, y),
        ha="right",
        va="bottom",
        fontsize=7,
        color="#c0392b",
        xytext=(-2, 1),
        textcoords="offset points",
        bbox=BOX,
    )


def _panel_title(panel: Any, text: str, verdict: str) -> None:
    colour = VERDICT_COLOURS.get(verdict, "black")
    panel.suptitle(f"{text}  [{verdict}]" if verdict else text, fontsize=11, fontweight="bold", color=colour)


def _measured(*stats: dict[str, Any]) -> bool:
    return all(st.get("n") for st in stats)


def _warm_clis(summary: dict[str, Any], panel: Any) -> None:
    """Rows 19-22: Claude Code and codex kept warm."""
    claude, codex = summary.get("claude-sdk", {}), summary.get("codex-app-server", {})
    _panel_title(panel, "19–22 Claude Code and codex kept warm", _verdicts(summary, ("19 ", "20 ", "21 ", "22 ")))
    axes = panel.subplots(1, 3, width_ratios=[1, 1, 1.4])

    ax = axes[0]
    if _measured(claude.get("warm", {}), claude.get("cold", {})):
        cold = claude["cold"]["median"]
        _bars(
            ax,
            ["cold one-shot\n(claude-code.yaml)", "warm\n(claude-sdk.yaml)"],
            [cold, claude["warm"]["median"]],
            "{:.1f}",
            [FLOOR, BRIDGE],
            boxed=True,
        )
        _target(ax, report.CLAUDE_WARM_VS_COLD * cold, f"{report.CLAUDE_WARM_VS_COLD:g}× cold")
        ax.set_ylabel("ms per turn (median)")
        _title(ax, "19 Claude Code turn", _verdicts(summary, "19 "), fontsize=9)
    else:
        _empty(ax, "19 Claude Code turn")

    ax = axes[1]
    if _measured(codex.get("bridge", {}), codex.get("direct", {})):
        direct = codex["direct"]["median"]
        _bars(
            ax,
            ["codex app-server\ndriven directly", "codex-app-server\nthrough the bridge"],
            [direct, codex["bridge"]["median"]],
            "{:.1f}",
            [FLOOR, BRIDGE],
            boxed=True,
        )
        _target(ax, direct + report.CODEX_OVER_DIRECT_MS, f"direct + {report.CODEX_OVER_DIRECT_MS:g} ms", boxed=True)
        ax.set_ylabel("ms per turn (median)")
        _title(ax, "20 codex turn", _verdicts(summary, "20 "), fontsize=9)
    else:
        _empty(ax, "20 codex turn")

    ax = axes[2]
    bars = [
        (measure, f"{cli}\n{measure}", m[measure]["p99"])
        for measure in ("partial", "permission")
        for cli, m in (("Claude Code", claude), ("codex", codex))
        if m.get(measure, {}).get("n")
    ]
    if bars:
        _bars(ax, [label for _, label, _ in bars], [p99 for _, _, p99 in bars], "{:.2f}", boxed=True)
        limits = {"partial": report.JSON_LATENCY_P99_MS, "permission": report.PERMISSION_P99_MS}
        if len(set(limits.values())) == 1:
            _target(ax, report.JSON_LATENCY_P99_MS, f"p99 {report.JSON_LATENCY_P99_MS:g} ms", left=True, boxed=True)
        else:
            for measure, limit in limits.items():
                at = [i for i, (m, _, _) in enumerate(bars) if m == measure]
                if at:
                    _target_over(ax, at[0], at[-1], limit, f"p99 {limit:g} ms")
        ax.set_ylabel("ms, chunk written → host callback (p99)")
        _title(ax, "21 partials, 22 permission requests, p99", _verdicts(summary, ("21 ", "22 ")), fontsize=9)
    else:
        _empty(ax, "21–22 partial and permission latency")


def _floor_and_bridge(
    ax: Any, labels: list[str], values: list[float], target: tuple[float, str], ylabel: str, title: tuple[str, str]
) -> None:
    """A floor's bar beside the bridge's, under the row's target (`target`: value, label; `title`: text, verdict)."""
    _bars(ax, labels, values, "{:.1f}", [FLOOR, BRIDGE], boxed=True)
    _target(ax, *target, left=True)
    ax.set_ylabel(ylabel)
    _title(ax, *title, fontsize=9)


def _attachments(summary: dict[str, Any], panel: Any) -> None:
    """Rows 23-24: fetching attachments."""
    fetched = summary.get("attachments", {})
    _panel_title(panel, "23–24 attachments from a loopback server", _verdicts(summary, ("23 ", "24 ")))
    axes = panel.subplots(1, 2)

    ax = axes[0]
    if _measured(*(fetched.get(name, {}) for name in ("attached", "plain", "curl"))):
        curl = fetched["curl"]["median"]
        added = fetched["attached"]["median"] - fetched["plain"]["median"]
        _floor_and_bridge(
            ax,
            ["curl\n(its start included)", "the bridge's fetch\n(turn with − without)"],
            [curl, added],
            (report.FETCH_VS_CURL * curl, f"{report.FETCH_VS_CURL:g}× curl"),
            "ms (median)",
            (f"23 fetch a {fetched['size']} file, median", _verdicts(summary, "23 ")),
        )
    else:
        _empty(ax, "23 fetch an attachment")

    ax = axes[1]
    if _measured(fetched.get("rss", {}), fetched.get("rss_before", {})):
        _floor_and_bridge(
            ax,
            ["before the turn", f"{fetched['fetched']}\nfetched at once"],
            [fetched["rss_before"]["max"], fetched["rss"]["max"]],
            (report.PEAK_RSS_MB, f"{report.PEAK_RSS_MB:g} MB"),
            "bridge peak RSS, MB (worst sample)",
            ("24 memory while fetching", _verdicts(summary, "24 ")),
        )
    else:
        _empty(ax, "24 memory while fetching")


def _network(summary: dict[str, Any], panel: Any) -> None:
    """Rows 25-28: the network door against stdin/stdout serve."""
    network = summary.get("network", {})
    _panel_title(
        panel,
        "25–28 the network door (serve --listen) against stdin/stdout serve",
        _verdicts(summary, ("25 ", "26 ", "27 ", "28 ")),
    )
    axes = panel.subplots(1, 3, width_ratios=[1.4, 1.1, 0.9])
    short = {"stdin": "stdin/stdout\nserve", "sse": "POST\nSSE", "json": "POST\nJSON", "ws": "WebSocket"}

    ax = axes[0]
    turns = network.get("turn", {})
    names = [name for name in short if turns.get(name, {}).get("n")]
    if names:
        _bars(
            ax,
            [short[n] for n in names],
            [turns[n]["median"] for n in names],
            "{:.2f}",
            [FLOOR if n == "stdin" else BRIDGE for n in names],
            boxed=True,
        )
        if "stdin" in names:
            plain = turns["stdin"]["median"]
            http = [i for i, n in enumerate(names) if n in ("sse", "json")]
            if http:
                _target_over(
                    ax,
                    http[0],
                    http[-1],
                    plain + report.HTTP_OVER_STDIN_MS,
                    f"stdin + {report.HTTP_OVER_STDIN_MS:g} ms",
                )
            if "ws" in names:
                at = names.index("ws")
                _target_over(ax, at, at, plain + report.WS_OVER_STDIN_MS, f"stdin + {report.WS_OVER_STDIN_MS:g} ms")
        ax.set_ylabel("ms per turn (median)")
        _title(ax, "25–26 echo turn", _verdicts(summary, ("25 ", "26 ")), fontsize=9)
    else:
        _empty(ax, "25–26 echo turn")

    ax = axes[1]
    latencies = network.get("latency", {})
    names = [name for name in ("stdin", "SSE", "WebSocket") if latencies.get(name, {}).get("n")]
    if names:
        _bars(
            ax,
            [short.get(n, n) for n in names],
            [latencies[n]["p99"] for n in names],
            "{:.2f}",
            [FLOOR if n == "stdin" else BRIDGE for n in names],
            boxed=True,
        )
        if "SSE" in names:
            at = names.index("SSE")
            _target_over(ax, at, at, report.SSE_LATENCY_P99_MS, f"p99 {report.SSE_LATENCY_P99_MS:g} ms (SSE)")
        ax.set_ylabel("ms, written → client's read (p99)")
        _title(ax, "27 partial latency, p99", _verdicts(summary, "27 "), fontsize=9)
    else:
        _empty(ax, "27 partial latency")

    ax = axes[2]
    if _measured(network.get("rss_mb", {}), network.get("before_mb", {})):
        _floor_and_bridge(
            ax,
            ["before them", f"{network['connections']:,} idle\nWebSocket"],
            [network["before_mb"]["max"], network["rss_mb"]["max"]],
            (report.IDLE_CONNECTIONS_RSS_MB, f"{report.IDLE_CONNECTIONS_RSS_MB:g} MB"),
            "serve RSS, MB (worst sample)",
            ("28 idle connections", _verdicts(summary, "28 ")),
        )
    else:
        _empty(ax, "28 idle connections")


def _confined(summary: dict[str, Any], panel: Any) -> None:
    """Rows 29-30: a sandboxed turn, a turn with rlimits."""
    confined = summary.get("confined", {})
    _panel_title(panel, "29–30 sandbox and limits, row 1's agent", _verdicts(summary, ("29 ", "30 ")))
    axes = panel.subplots(1, 2)
    for ax, number, name, floor, floor_name, limit in (
        (axes[0], 29, "sandboxed", "bwrap", "bwrap alone", report.SANDBOX_OVER_BWRAP_MS),
        (axes[1], 30, "rlimits", "bridge", "no limits", report.RLIMITS_OVER_PLAIN_MS),
    ):
        what = f"{number} {'sandboxed turn' if name == 'sandboxed' else 'turn with rlimits'}"
        if _measured(confined.get(name, {}), confined.get(floor, {})):
            plain = confined[floor]["median"]
            _bars(
                ax,
                [floor_name, "sandbox: {}" if name == "sandboxed" else "limits: (rlimits)"],
                [plain, confined[name]["median"]],
                "{:.2f}",
                [FLOOR, BRIDGE],
                boxed=True,
            )
            # Row 30's target sits just above its floor's bar: its label goes over the other bar.
            _target(ax, plain + limit, f"{floor_name} + {limit:g} ms", left=name == "sandboxed", boxed=True)
            ax.set_ylabel("ms per turn (median)")
            _title(ax, what, _verdicts(summary, f"{number} "), fontsize=9)
        else:
            _empty(ax, what)


def draw_more(summary: dict[str, Any], about: dict[str, Any], path: str) -> None:
    """Rows 19-30 as a second PNG: a panel per group of rows, an axes per measure, each with its target."""
    fig = plt.figure(figsize=(17, 9.5), layout="constrained")
    panels = fig.subfigures(2, 2, width_ratios=[3, 2], wspace=0.03, hspace=0.04)
    _warm_clis(summary, panels[0][0])
    _attachments(summary, panels[0][1])
    _network(summary, panels[1][0])
    _confined(summary, panels[1][1])
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (BRIDGE, FLOOR)]
    fig.legend(
        handles, ["agent-bridge", "floor / reference"], loc="outside lower center", ncol=2, fontsize=9, frameon=False
    )
    quick = "  —  QUICK run, not for comparison" if summary.get("quick") else ""
    fig.suptitle(
        f"agent-bridge benchmarks, rows 19–30 (dashed red: the issues' targets){quick}\n{report.machine_line(about)}",
        fontsize=10,
    )
    fig.savefig(path, dpi=100)
    plt.close(fig)

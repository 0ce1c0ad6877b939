"""The summary as one PNG: a panel per benchmark, bars of medians, the target as a dashed line."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import report

BRIDGE, FLOOR, AGENTPROC, REF = "#2b7bba", "#9e9e9e", "#e08a2b", "#c7c7c7"
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


def _bars(ax: Any, labels: list[str], values: list[float], fmt: str, colours: list[str] | None = None) -> None:
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
        )
    ax.margins(y=0.18)
    ax.tick_params(axis="x", labelsize=8)


def _target(ax: Any, y: float, text: str, left: bool = False) -> None:
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
    )


def _verdicts(summary: dict[str, Any], prefix: str) -> str:
    results = [r["result"] for r in summary["rows"] if r["benchmark"].startswith(prefix) and r["result"]]
    return "PASS" if results and all(r == "PASS" for r in results) else ("FAIL" if results else "")


def _title(ax: Any, text: str, verdict: str) -> None:
    colour = {"PASS": "#1e8449", "FAIL": "#c0392b"}.get(verdict, "black")
    ax.set_title(f"{text}  [{verdict}]" if verdict else text, fontsize=10, color=colour)


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

"""The calibration's report beside its JSON (``<name>_report.md``, ``<name>_risk_coverage.png``): what each alpha
gets on the calibration split, per reader."""
from __future__ import annotations

from pathlib import Path

from edge_rag.decision.certify import Calibration, clopper_pearson_upper
from edge_rag.decision.kind import Kind
from edge_rag.storage.fileio import atomic_write_text


def report(out: dict, path: Path, alphas: tuple[float, ...], useful_coverage: float,
           design_alpha: float) -> str:
    """Markdown summary beside the JSON (and the risk-coverage PNG): what each alpha gets on calibration."""
    cal = Calibration.load(path)
    lines = ["# Calibration of the certified decision layer", "",
             f"`{out['source']['command']}`; splits `{out['source']['splits']}`; "
             f"{out['source']['n_calibration']} SQuAD + {out['source'].get('n_hotpotqa_calibration', 0)} HotpotQA "
             f"calibration questions, {out['source']['n_reader_val']} reader-val + "
             f"{out['source'].get('n_select', 0)} model-selection (validation), "
             f"{out['source']['n_ood_calibration']} OOD-calibration.", ""]
    for name, rc in cal.readers.items():
        fr = out["readers"][name]["floor_refuses"]
        lines += [f"## reader = {name}", "",
                  f"Out-of-domain floor: squared L2 d_min > {rc.ood_distance:.3f} (cosine < "
                  f"{1 - rc.ood_distance / 2:.3f}) refuses. Floor refuses {fr['ood_calibration']:.1%} of OOD-calibration, {fr['calibration_answerable']:.1%} of "
                  f"answerable and {fr['calibration_unanswerable']:.1%} of unanswerable calibration questions.", "",
                  f"GPT route: {rc.gpt_errors} errors in {rc.gpt_n} generated answers "
                  f"(upper bound {clopper_pearson_upper(rc.gpt_errors, rc.gpt_n, 0.05 / rc.tests):.2f} at delta 0.05, "
                  f"shared by the {rc.tests} certificates a decision answers by).", "",
                  "| alpha | delta | threshold | coverage | error among answered | CP upper | errors: to unanswerables "
                  "/ wrong answers |", "|---|---|---|---|---|---|---|"]
        table = out["readers"][name]["table"]
        for alpha in alphas:
            for delta in (0.05, 0.1):
                c = rc.certificate(Kind.SINGLE_HOP, alpha, delta)
                to_none = table["n_errors_unanswerable"][table["thresholds"].index(c.threshold)] if c.n_answered else 0
                lines.append(f"| {alpha:g} | {delta:g} | {c.threshold:.3f} | {c.coverage:.1%} | {c.error:.1%} "
                             f"| {c.upper:.3f} | {to_none} / {c.n_errors - to_none} |")
        lines += kind_lines(out["readers"][name], rc, alphas, design_alpha)
        useful = [a for a in alphas if rc.certificate(Kind.SINGLE_HOP, a, 0.05).coverage >= useful_coverage]
        lines += ["", f"Smallest alpha certified at delta 0.05 while answering >= {useful_coverage:.0%} of calibration: "
                      f"{useful[0] if useful else 'none'} (the default Config().max_error_rate is "
                      f"{design_alpha:g}).", ""]
    png = path.with_name(f"{path.stem}_risk_coverage.png")
    plot(cal, png)
    lines.append(f"![risk-coverage]({png.name})")
    text = "\n".join(lines) + "\n"
    atomic_write_text(path.with_name(f"{path.stem}_report.md"), text)
    return text


def kind_lines(raw: dict, rc, alphas: tuple[float, ...], design_alpha: float) -> list[str]:
    """The table above counts single-hop questions; each other kind's certificate, in a line, and what the
    single-hop threshold of the default alpha would do to that kind's questions."""
    if "kinds" not in raw:
        return []
    hotpot = raw["kinds"]["hotpotqa_by_kind"]
    lines = ["", f"The table counts the {rc.table.n_cal} questions the kind model calls single-hop "
                 f"({hotpot[Kind.SINGLE_HOP.value]} of them HotpotQA's)."]
    for kind, table in rc.kind_tables.items():
        certified = [(a, rc.certificate(kind, a, 0.05)) for a in alphas]
        shown = ", ".join(f"{a:g}: {c.coverage:.1%}" for a, c in certified if c.n_answered) or "none"
        lines.append(f"{kind.value}: {table.n_cal} calibration questions ({hotpot[kind.value]} HotpotQA); "
                     f"coverage certified at delta 0.05 by alpha: {shown}.")
        single = rc.certificate(Kind.SINGLE_HOP, design_alpha, 0.05).threshold
        if single in table.thresholds:  # the same grid; inf (nothing certified) is not on it
            at = table.thresholds.index(single)
            lines[-1] += (f" At the single-hop threshold of alpha {design_alpha:g} they would be answered "
                          f"{table.n_answered[at]} times, {table.n_errors[at]} of them wrongly.")
    return lines


def plot(cal, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rc in cal.readers.items():
        cov, err = zip(*rc.table.curve())
        ax.plot(cov, err, label=f"{name}: error among answered")
    for alpha in (0.1, 0.2):
        ax.axhline(alpha, ls=":", c="grey")
    ax.set_xlabel("coverage (share of calibration questions answered)")
    ax.set_ylabel("error among answered")
    ax.set_title("Risk-coverage on the calibration split")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)

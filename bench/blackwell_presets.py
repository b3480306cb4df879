"""Derives the B200 and GB200 datasheet presets' efficiencies from published Blackwell measurements against the H100's own.

    python bench/blackwell_presets.py           # write the derived fields into vime/sim/data/hardware/{B200,GB200}.json
    python bench/blackwell_presets.py --check   # exit 1 unless the committed presets hold what this derives

No Blackwell GPU has been lent, so the chip's rates come from published figures (`bench/data/chips/blackwell.json`,
quoted in `blackwell_sources.md`) taken as ratios to an H100 measured the same way, times what the H100-SXM-80G preset
holds (measured on a lent H100, or validated on the NeMo-RL H100 rows):

- GEMM-bound rates (training, prefill): the chips' best bf16 GEMM as a fraction of peak, Blackwell's over the H100's;
- decode (weights streamed and KV read): vLLM's inter-token latency on an H100 and a B200 in one harness, over their
  HBM ratio: the fraction of its HBM a Blackwell GPU reads at relative to the H100's (the GPU-bound rows' median);
- GB200's host link: the measured NVLink-C2C copy rates (nvbandwidth); B200's PCIe Gen5 link copies as the H100's;
- B200's HBM: the driver's 7.672 TB/s (its datasheet said 8).

The GB200 NeMo-RL rows (`bench/data/published/`) were seen before this was written; nothing here is fitted on them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data" / "chips" / "blackwell.json"
HW = ROOT / "vime" / "sim" / "data" / "hardware"
CHIPS = ("GB200", "B200")


def decode_ratio(data: dict) -> float:
    """A Blackwell GPU's fraction of its HBM in vLLM's decode over the H100's: ITL speedup / HBM ratio, the median."""
    d = data["decode_itl_ms"]
    bw = d["hbm_tb_s"]["B200"] / d["hbm_tb_s"]["H100"]
    return statistics.median(r["H100"] / r["B200"] / bw for r in d["rows"].values())


def gemm_ratio(data: dict, chip: str) -> float:
    """The chip's best bf16 GEMM as a fraction of its peak, over the H100's."""
    g = data["best_gemm_tflops"]
    return (g[chip]["measured"] / g[chip]["peak"]) / (g["H100"]["measured"] / g["H100"]["peak"])


def derive(chip: str, preset: dict, h100: dict, data: dict) -> dict:
    """`preset` with its derived fields and their sources."""
    out = json.loads(json.dumps(preset))
    eff, src, he = out["efficiency"], out["sources"], h100["efficiency"]
    g, r = gemm_ratio(data, chip), decode_ratio(data)
    gemm = data["best_gemm_tflops"]
    gsrc = (f"{gemm['source']}: {chip} {gemm[chip]['measured']:g} of {gemm[chip]['peak']:g} TFLOP/s, H100 "
            f"{gemm['H100']['measured']:g} of {gemm['H100']['peak']:g}")
    dsrc = (f"{data['decode_itl_ms']['source']}: {', '.join(data['decode_itl_ms']['rows'])}; the median of ITL speedup / "
            f"HBM ratio is {r:.3f} (left out: {data['decode_itl_ms']['left_out']})")
    eff["train_mfu"] = round(he["train_mfu"] * g, 3)
    src["efficiency.train_mfu"] = (f"derived (bench/blackwell_presets.py): H100-SXM-80G's {he['train_mfu']} x the best-GEMM "
                                   f"ratio {g:.3f}; {gsrc}. NeMo's FP8 dense Llama pretraining reaches the same fraction "
                                   "of peak on GB200 and H100 (Megatron-Bridge performance-summary-archive, 26.04.01: "
                                   "Llama3-70B 0.378 vs 0.369), so Hopper's MFU carries over scaled by the GEMM ratio")
    eff["prefill_mfu"] = round(he["prefill_mfu"] * g, 4)
    src["efficiency.prefill_mfu"] = (f"derived (bench/blackwell_presets.py): H100-SXM-80G's measured {he['prefill_mfu']} x "
                                     f"the best-GEMM ratio {g:.3f} (efficiency.train_mfu says whose)")
    eff["decode_bw_util"] = round(he["decode_bw_util"] * r, 4)
    src["efficiency.decode_bw_util"] = (f"derived (bench/blackwell_presets.py): H100-SXM-80G's measured KV read "
                                        f"({he['decode_bw_util']} of its HBM) x {r:.3f}; {dsrc}")
    eff["decode_weight_bw_util"] = round(he["decode_weight_bw_util"] * r, 4)
    src["efficiency.decode_weight_bw_util"] = (f"derived (bench/blackwell_presets.py): H100-SXM-80G's measured weight "
                                               f"streaming ({he['decode_weight_bw_util']} of its HBM) x {r:.3f}, as "
                                               "efficiency.decode_bw_util")
    if chip == "GB200":
        link = data["gb200_host_link_gb_s"]
        out["host_link_h2d_bytes_per_s"], out["host_link_d2h_bytes_per_s"] = link["h2d"] * 1e9, link["d2h"] * 1e9
        src["host_link_h2d_bytes_per_s"] = (f"measured: {link['h2d']:g} GB/s host to device, {link['d2h']:g} device to "
                                            f"host per GPU over NVLink-C2C (one Grace link for two GPUs); {link['source']}")
        src["host_link_d2h_bytes_per_s"] = "as host_link_h2d_bytes_per_s"
        eff["host_copy_util"] = 1.0
        src["efficiency.host_copy_util"] = "1.0: the host-link rates above are measured copy rates"
    else:
        hbm = data["b200_hbm_tb_s"]
        out["hbm_bytes_per_s"] = hbm["value"] * 1e12
        src["hbm_bytes_per_s"] = f"{hbm['source']} (NVIDIA's HGX B200 table: 7.7 TB/s; earlier datasheets: 8)"
        eff["host_copy_util"] = he["host_copy_util"]
        src["efficiency.host_copy_util"] = (f"H100-SXM-80G's measured {he['host_copy_util']} (pinned copies over the same "
                                            f"PCIe Gen5 x16 link): {h100['sources']['efficiency.host_copy_util']}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail unless the committed presets are what this derives")
    a = ap.parse_args(argv)
    data = json.loads(DATA.read_text())
    h100 = json.loads((HW / "H100-SXM-80G.json").read_text())
    bad = []
    for chip in CHIPS:
        path = HW / f"{chip}.json"
        text = json.dumps(derive(chip, json.loads(path.read_text()), h100, data), indent=2) + "\n"
        if a.check:
            if path.read_text() != text:
                bad.append(chip)
            continue
        path.write_text(text)
        eff = json.loads(text)["efficiency"]
        print(f"wrote {path}: " + ", ".join(f"{k} {eff[k]}" for k in
              ("train_mfu", "prefill_mfu", "decode_bw_util", "decode_weight_bw_util", "host_copy_util")))
    if bad:
        print(f"not as derived: {', '.join(bad)} (run python bench/blackwell_presets.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

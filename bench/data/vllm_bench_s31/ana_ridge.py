import json, sys, glob
from pathlib import Path
ROOT=Path('/work/main'); sys.path[:0]=[str(ROOT),str(ROOT/'bench'),str(ROOT/'scripts/h200'),str(ROOT/'scripts/h200_train')]
from compare_calibration import _iter_model
from fit_whole_step import model_of
from vime.sim.hardware import HardwareSpec
PROF={'h200':'H200-141G-measured.json','h100':'H100-SXM-80G-measured.json'}
RUNS=[('h100','bench/data/vllm_bench_s29/vllm_4b_h100.json'),('h100','bench/data/vllm_bench_s29/vllm_8b_h100.json'),
('h100','bench/data/vllm_bench_s30/vllm_14b_h100.json'),('h100','bench/data/vllm_bench_s30/vllm_32b_h100.json'),
('h200','bench/data/vllm_bench_s31/vllm_14b_h200.json'),('h200','bench/data/vllm_bench_s31/vllm_32b_h200.json'),
('h200','bench/data/h200_vllm_0.25.1_b1.json'),('h200','bench/data/h200_vllm_0.25.1_b2.json'),('h200','bench/data/vllm_bench_s15/vllm_4b_s15.json'),
('h100','bench/data/vllm_bench_s30/vllm_moe48_h100.json'),('h200','bench/data/vllm_bench_s31/vllm_moe48_h200.json')]
def terms(im,b,n):
    out=[]
    for j in range(n-1):
        c=b*(128+j+1)
        C,m0,m1,f0,f1=im.decode_lines(b,c)
        out.append((C,m0,f0,im.host(b)))
    k=len(out); return [sum(x[i] for x in out)/k for i in range(4)]
def run(p_norm=None, alpha=None):
    rows=[]
    for chip,f in RUNS:
        d=json.load(open(ROOT/f)); hw=HardwareSpec.from_dict(json.load(open(ROOT/'vime/sim/data/hardware'/PROF[chip])),origin='x')
        im=_iter_model(hw, model_of(d['preset']))
        for r in d['phases']['decode']:
            b,n=r['batch'],r['max_tokens']; meas=r.get('itl_mean_s')
            if not meas: continue
            C,m,c,h=terms(im,b,n)
            if p_norm: g=(m**p_norm+c**p_norm)**(1/p_norm)
            elif alpha is not None: g=max(m,c)+alpha*min(m,c)
            else: g=max(m,c)
            pred=max(C+g,h)
            rows.append((chip,d['preset'],b,n,meas*1e3,pred*1e3,C*1e3,m*1e3,c*1e3,h*1e3))
    return rows
if __name__=='__main__':
    for r in run():
        chip,pr,b,n,meas,pred,C,m,c,h=r
        print(f"{chip} {pr:18s} B={b:3d} n={n:4d} meas {meas:6.2f} model {pred:6.2f} ({100*(pred-meas)/meas:+6.1f} %)  fixed {C:5.2f} mem {m:6.2f} comp {c:6.2f} host {h:6.2f}  comp/mem {c/m:4.2f}")

import json, sys, math
from pathlib import Path
sys.path.insert(0,'/tmp/ana')
from ridge import *
from ridge import _iter_model
def rows():
    out=[]
    for chip,f in RUNS:
        d=json.load(open(ROOT/f)); hw=HardwareSpec.from_dict(json.load(open(ROOT/'vime/sim/data/hardware'/PROF[chip])),origin='x')
        im=_iter_model(hw, model_of(d['preset']))
        if im.expert_bytes: continue
        kvr=im.kv_bytes_per_s or im.bytes_per_s; wr=im.weight_bytes_per_s or im.bytes_per_s; sc=1/(im.tp*im.flops_per_s)
        for r in d['phases']['decode']:
            b,n=r['batch'],r['max_tokens']; meas=r.get('itl_mean_s')
            if not meas: continue
            acc=[]
            for j in range(n-1):
                c=b*(128+j+1)
                acc.append((im.fixed(b)+im.sample_s*b, im.weight_bytes/wr, im.kv_bytes_per_token*c/kvr,
                            (im.flops_base+im.flops_head)*b*sc, im.flops_per_ctx*c*sc, im.host(b)))
            out.append((chip,d['preset'],b,n,meas,acc))
    return out
def structures(Mh=0.0,p=None,serial_kv=False):
    def f(C,w,kv,g,a,h,b):
        g2=g*(1+Mh/b)
        if serial_kv:
            gem=max(w,g2) if p is None else (w**p+g2**p)**(1/p)
            t=C+gem+max(kv,a)
        else:
            m,c=w+kv,g2+a
            t=C+(max(m,c) if p is None else (m**p+c**p)**(1/p))
        return max(t,h)
    return f
R=rows()
def score(fn, show=False, filt=lambda r: True):
    errs=[]
    for chip,pr,b,n,meas,acc in R:
        if not filt((chip,pr,b,n)): continue
        pred=sum(fn(*x,b) for x in acc)/len(acc)
        e=100*(pred-meas)/meas; errs.append((chip,pr,b,n,e))
        if show: print(f"  {chip} {pr:10s} B={b:3d} n={n:4d} meas {meas*1e3:6.2f} pred {pred*1e3:6.2f} {e:+6.1f} %")
    return errs
if __name__=='__main__':
    big=lambda r: r[1] in ('qwen3-14b','qwen3-32b','qwen3-8b')
    for name,fn in [('now',structures()),('serial_kv',structures(serial_kv=True)),
                    ('Mh64',structures(64)),('Mh98',structures(98)),('serial+Mh64',structures(64,serial_kv=True)),
                    ('p3',structures(p=3)),('p2',structures(p=2)),('serial+p3',structures(p=3,serial_kv=True)),('serial+p2',structures(p=2,serial_kv=True)),
                    ('serial+p2.5',structures(p=2.5,serial_kv=True)),('serial+p4',structures(p=4,serial_kv=True))]:
        e=score(fn,filt=big)
        ab=sorted(abs(x[-1]) for x in e)
        print(f"{name:14s} median |e| {ab[len(ab)//2]:5.1f}  max {ab[-1]:5.1f}  " + " ".join(f"{x[1][6:]}{x[0][-2:]}:{x[2]}x{x[3]}:{x[4]:+.0f}" for x in e if x[2]>=64))

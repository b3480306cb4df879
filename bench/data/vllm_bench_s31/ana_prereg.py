import json, sys
sys.path.insert(0,'/tmp/ana')
from ridge2 import *
from ridge import _iter_model
GRIDS=[('h200','qwen3-32b',[(96,128),(192,128),(256,128),(384,128),(512,128)]),
       ('h200','qwen3-8b',[(1,256),(64,256),(128,256),(192,256),(256,256),(384,256),(512,256)]),
       ('h100','qwen3-14b',[(96,128),(128,128),(192,128),(256,128),(384,128),(512,128)]),
       ('h100','qwen3-8b',[(1,256),(64,256),(128,256),(192,256),(256,256),(384,256),(512,256)])]
H={'now':structures(),'serial_kv':structures(serial_kv=True),'serial+Mh64':structures(64,serial_kv=True),'serial+p2.5':structures(p=2.5,serial_kv=True)}
res={}
for chip,pre,grid in GRIDS:
    hw=HardwareSpec.from_dict(json.load(open(ROOT/'vime/sim/data/hardware'/PROF[chip])),origin='x')
    im=_iter_model(hw, model_of(pre))
    kvr=im.kv_bytes_per_s or im.bytes_per_s; wr=im.weight_bytes_per_s or im.bytes_per_s; sc=1/(im.tp*im.flops_per_s)
    for b,n in grid:
        acc=[(im.fixed(b)+im.sample_s*b, im.weight_bytes/wr, im.kv_bytes_per_token*b*(128+j+1)/kvr,
              (im.flops_base+im.flops_head)*b*sc, im.flops_per_ctx*b*(128+j+1)*sc, im.host(b)) for j in range(n-1)]
        key=f"{chip} {pre} B={b} x {n}"
        res[key]={h:1e3*sum(fn(*x,b) for x in acc)/len(acc) for h,fn in H.items()}
        print(f"{key:28s} "+"  ".join(f"{h} {v:6.2f}" for h,v in res[key].items()))
json.dump(res,open('/work/main/bench/data/vllm_bench_s31/predicted_grid_structures.json','w'),indent=1)

"""Compare every kernel's PTX between two source trees (a restructuring must not change a kernel).

    # PTX of each .cu of both trees, then compare (the names of the .ptx files do not matter):
    (cd OLD/csrc && for f in $(find . -name '*.cu'); do nvcc -O3 -std=c++17 -lineinfo -arch=sm_90a -ptx -I. $f \
        -o /tmp/old/$(echo ${f#./} | tr / _).ptx; done)      # same for NEW into /tmp/new
    python3 benchmarks/tools/ptx_compare.py /tmp/old /tmp/new

Kernels are matched by their mangled names; their bodies are compared after dropping what depends
only on where the code sits in its file: .loc/.file debug lines, comments, and the per-file numbering
of labels and local depots."""
import re, glob, hashlib, sys
def norm(body):
    body=re.sub(r"//.*$","",body,flags=re.M)  # comments (e.g. which kernel follows in the file)
    body=re.sub(r"^\s*\.loc\s.*$","",body,flags=re.M)
    body=re.sub(r"^\s*\.file\s.*$","",body,flags=re.M)
    body=re.sub(r"\$L__BB\d+_",r"$L__BB_",body)
    body=re.sub(r"__local_depot\d+",r"__local_depot",body)
    body=re.sub(r"\$L__tmp\d+",r"$L__tmp",body)
    body=re.sub(r"\$L__func_begin\d+",r"$L__func_begin",body)
    body=re.sub(r"\$L__func_end\d+",r"$L__func_end",body)
    return re.sub(r"\s+"," ",body)
def funcs(d):
    out={}
    for f in glob.glob(d+"/*.ptx"):
        s=open(f).read()
        s=re.split(r"^\s*\.section", s, flags=re.M)[0]  # debug sections at the end
        idx=[m.start() for m in re.finditer(r"^\.(?:visible |weak )?\.entry ", s, flags=re.M)]
        for k,i in enumerate(idx):
            j=idx[k+1] if k+1<len(idx) else len(s)
            body=s[i:j]
            name=re.match(r"\.(?:visible |weak )?\.entry (\S+?)\(", body).group(1)
            out[name]=hashlib.sha1(norm(body).encode()).hexdigest()
    return out
a=funcs(sys.argv[1]); b=funcs(sys.argv[2])
print("kernels before", len(a), "after", len(b), "| only before", len(set(a)-set(b)), "only after", len(set(b)-set(a)))
diff=[k for k in a if k in b and a[k]!=b[k]]
print("kernels whose PTX differs:", len(diff))
for k in diff[:5]: print("  ", k)

import torch, torch.nn.functional as F
torch.manual_seed(0)
def rep(t, n): b,h,L,d=t.shape; return t[:,:,None].expand(b,h,n,L,d).reshape(b,h*n,L,d)
for dt in (torch.bfloat16, torch.float32):
  for (b, ql, L, hq, hkv, d) in [(2,9,9,4,2,32),(2,1,9,4,2,32),(1,9,9,4,2,32),(2,9,9,32,8,128),(2,1,600,32,8,128)]:
    q=torch.randn(b,hq,ql,d,device='cuda',dtype=dt); k=torch.randn(b,hkv,L,d,device='cuda',dtype=dt); v=torch.randn_like(k)
    causal=torch.ones(ql,L,dtype=torch.bool,device='cuda').tril(L-ql)
    mask=causal[None,None].expand(b,1,ql,L).clone(); mask[0,:,:,:3]=False
    if ql>3: mask[0,:,:3,:]=False; mask[0,:,:3,0]=True  # keep rows non-empty
    a=F.scaled_dot_product_attention(q,rep(k,hq//hkv),rep(v,hq//hkv),attn_mask=mask)
    c=F.scaled_dot_product_attention(q,k,v,attn_mask=mask,enable_gqa=True)
    err=[(a[i]-c[i]).abs().max().item() for i in range(b)]
    print(dt, (b,ql,L,hq,hkv,d), "max diff per batch", err)

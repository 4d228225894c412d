"""Write a deterministic synthetic source tree: text files in nested folders plus binary blobs."""
import os
import random
import sys

root, files, text_bytes, binary_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(42)
words = [f"token{i}" for i in range(512)]
for index in range(files):
    folder = os.path.join(root, f"pkg{index // 1000:03d}", f"mod{(index // 100) % 10}")
    os.makedirs(folder, exist_ok=True)
    size = max(64, int(rng.gauss(text_bytes, text_bytes / 4)))
    lines, length = [], 0
    while length < size:
        line = "    ".join(rng.choice(words) for _ in range(8)) + "\n"
        lines.append(line)
        length += len(line)
    with open(os.path.join(folder, f"file{index}.py"), "w") as handle:
        handle.write("".join(lines))
blobs = os.path.join(root, "assets")
os.makedirs(blobs, exist_ok=True)
for blob in range((binary_mb + 63) // 64):
    with open(os.path.join(blobs, f"blob{blob}.bin"), "wb") as handle:
        remaining = min(64, binary_mb - blob * 64) * 1024 * 1024
        while remaining > 0:
            chunk = rng.randbytes(min(remaining, 1 << 20))
            handle.write(chunk)
            remaining -= len(chunk)

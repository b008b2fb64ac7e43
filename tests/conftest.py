import sys
from pathlib import Path

# The control plane is imported from the checkout, as `python -m complyroute` does.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

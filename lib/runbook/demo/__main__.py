import sys

from runbook.demo.llama import main

sys.exit(main())

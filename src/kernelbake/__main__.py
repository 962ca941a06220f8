from kernelbake.cli import main

raise SystemExit(main())

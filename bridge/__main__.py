from bridge.commands.cli import main

raise SystemExit(main())

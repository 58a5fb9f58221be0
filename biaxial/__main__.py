from biaxial.cli import main

raise SystemExit(main())

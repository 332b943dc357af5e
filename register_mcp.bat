@echo off
rem Register the second-brain MCP server (mcp_server.py, stdio) with Claude Code via "claude mcp add".
rem
rem Usage: register_mcp.bat [PYTHON] [--config PATH] [--scope local/user/project]
rem
rem   PYTHON          interpreter that runs the server (default: .venv\Scripts\python.exe beside this script
rem                   if it exists, else python, else python3 on PATH)
rem   --config PATH   config file the server reads (default: KB_CONFIG, else config.yaml beside the scripts,
rem                   created from config.example.yaml on first run)
rem   --scope SCOPE   user (default: every project), local (only the current folder, private to you) or
rem                   project (writes .mcp.json in the current folder, to share with the team)
rem
rem The server name is read through kb_config (server.name / KB_SERVER_NAME), so it matches what the server
rem reports. Re-running replaces an existing registration of that name in that scope. Without the claude CLI
rem it prints a JSON snippet for Claude Desktop, Cursor and other MCP clients instead, and exits 0.
rem
rem Exit codes: 0 registered (or snippet printed), 1 python or "claude mcp add" failed, 2 usage error.
rem Mirrors register_mcp.sh; no delayed expansion and no parenthesised blocks around variables set in them.

setlocal EnableExtensions DisableDelayedExpansion

rem Read before any shift: shift moves %0 too.
set "REPO_DIR=%~dp0"
if "%REPO_DIR:~-1%"=="\" set "REPO_DIR=%REPO_DIR:~0,-1%"
set "SERVER_PY=%REPO_DIR%\mcp_server.py"
set "SELF=%~nx0"

rem Claude Code's own default is "local"; notes are useful in every project, so we default to "user".
set "SCOPE=user"
set "FALLBACK_NAME=second-brain"
set "PY="
set "CONFIG=%KB_CONFIG%"

:parse
if "%~1"=="" goto parsed
set "ARG=%~1"
if /i "%ARG%"=="-h" goto help
if /i "%ARG%"=="--help" goto help
if "%ARG%"=="/?" goto help
if /i "%ARG%"=="--config" goto opt_config
if /i "%ARG%"=="--scope" goto opt_scope
if /i "%ARG%"=="-s" goto opt_scope
if "%ARG:~0,1%"=="-" goto err_unknown
if defined PY goto err_two_pythons
set "PY=%ARG%"
shift
goto parse

:opt_config
if "%~2"=="" goto err_config_arg
set "CONFIG=%~2"
shift
shift
goto parse

:opt_scope
if "%~2"=="" goto err_scope
set "SCOPE=%~2"
shift
shift
goto parse

:parsed
if /i "%SCOPE%"=="local" goto scope_ok
if /i "%SCOPE%"=="user" goto scope_ok
if /i "%SCOPE%"=="project" goto scope_ok
goto err_scope
:scope_ok

set "TMPBASE=%TEMP%\register_mcp_%RANDOM%%RANDOM%"
set "OUT=%TMPBASE%.out"
set "ERR=%TMPBASE%.err"

rem ---- installed command -------------------------------------------------------------------------------------
rem An installed second-brain-mcp (pipx install .) is registered as itself unless PYTHON is given.
set "INSTALLED="
if defined PY goto installed_done
for /f "delims=" %%I in ('where second-brain-mcp 2^>nul') do if not defined INSTALLED set "INSTALLED=%%I"
:installed_done

rem ---- python ------------------------------------------------------------------------------------------------
if defined PY goto have_py
if exist "%REPO_DIR%\.venv\Scripts\python.exe" set "PY=%REPO_DIR%\.venv\Scripts\python.exe"
if defined PY goto have_py
where python >nul 2>&1 && set "PY=python"
if defined PY goto have_py
where python3 >nul 2>&1 && set "PY=python3"
if defined PY goto have_py
echo error: no python found; create the venv (python -m venv .venv, then .venv\Scripts\pip install -r requirements.txt) or pass PYTHON 1>&2
exit /b 1

:have_py
rem Let python name its own absolute path (works for "python", "py", relative paths and venvs alike).
"%PY%" -c "import sys; print(sys.executable)" >"%OUT%" 2>nul
if errorlevel 1 goto err_python
set "PY_ABS="
set /p PY_ABS=<"%OUT%"
if not defined PY_ABS goto err_python
set "PY=%PY_ABS%"
rem Installed, not imported: importing mcp takes over a second.
"%PY%" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('mcp') and u.find_spec('yaml')))" >nul 2>&1
if errorlevel 1 (
    echo warning: "%PY%" has no mcp or yaml installed, so the server will not start; install the requirements: 1>&2
    echo   "%PY%" -m pip install -r "%REPO_DIR%\requirements.txt" 1>&2
)

rem ---- config file -------------------------------------------------------------------------------------------
rem KB_CONFIG is passed on as --config: Claude Code starts the server without this window's environment.
set "CONFIG_ARGS="
if not defined CONFIG goto config_done
for %%I in ("%CONFIG%") do set "CONFIG=%%~fI"
if exist "%CONFIG%\*" goto err_config_missing
if not exist "%CONFIG%" goto err_config_missing
set CONFIG_ARGS=--config "%CONFIG%"
:config_done

rem ---- server name, through the project's own config loader ---------------------------------------------------
rem load_cli_config is what mcp_server.py calls, so the name matches; it creates config.yaml on first run.
set "GET_NAME=import sys; sys.excepthook = lambda t, e, tb: print(t.__name__ + ':', e, file=sys.stderr); from pathlib import Path; from types import SimpleNamespace; from kb_config import load_cli_config; p = sys.argv[1]; print(load_cli_config(SimpleNamespace(config=Path(p) if p else None, kb_dir=None)).server_name)"
set "NAME="
pushd "%REPO_DIR%"
"%PY%" -c "%GET_NAME%" "%CONFIG%" >"%OUT%" 2>"%ERR%"
set "NAME_RC=%ERRORLEVEL%"
popd
set /p NAME=<"%OUT%"
if not "%NAME_RC%"=="0" set "NAME="
if defined NAME goto name_ok
echo warning: could not read server.name through kb_config; using '%FALLBACK_NAME%'. The loader said: 1>&2
type "%ERR%" 1>&2
echo   (the server will probably fail to start too: fix the config, then run this script again) 1>&2
set "NAME=%FALLBACK_NAME%"
goto name_done
:name_ok
rem e.g. "created config.yaml from config.example.yaml"
type "%ERR%" 1>&2
:name_done
del "%OUT%" "%ERR%" >nul 2>&1

rem Claude Code starts servers in the project folder: pin the per-user config an installed command would find.
set "CMD=%PY%"
set CMD_SCRIPT="%SERVER_PY%"
if not defined INSTALLED goto cmd_done
set "CMD=%INSTALLED%"
set "CMD_SCRIPT="
if not defined CONFIG_ARGS if exist "%APPDATA%\second-brain-mcp\config.yaml" set CONFIG_ARGS=--config "%APPDATA%\second-brain-mcp\config.yaml"
:cmd_done

echo server name: %NAME%
echo command:     "%CMD%" %CMD_SCRIPT% %CONFIG_ARGS%

rem ---- without claude: print a snippet for other clients -----------------------------------------------------
where claude >nul 2>&1
if not errorlevel 1 goto register
echo.
echo The 'claude' CLI (Claude Code) is not on PATH, so nothing was registered.
echo Install it with:  npm install -g @anthropic-ai/claude-code   then run this script again.
echo.
echo For Claude Desktop, Cursor or another MCP client, add this to its MCP config (mcpServers):
echo.
rem json.dumps escapes the backslashes of Windows paths.
"%PY%" -c "import json, sys; print(json.dumps({'mcpServers': {sys.argv[1]: {'command': sys.argv[2], 'args': sys.argv[3:]}}}, indent=2))" "%NAME%" "%CMD%" %CMD_SCRIPT% %CONFIG_ARGS%
exit /b 0

rem ---- register ----------------------------------------------------------------------------------------------
:register
rem "call": claude may be a .cmd shim, and running one without call never returns to this script.
rem Remove first so re-running is idempotent ("already exists" otherwise); a missing entry is not an error.
call claude mcp remove "%NAME%" --scope %SCOPE% >nul 2>&1
if not errorlevel 1 echo replaced the existing '%NAME%' registration (%SCOPE% scope)
call claude mcp add --scope %SCOPE% "%NAME%" -- "%CMD%" %CMD_SCRIPT% %CONFIG_ARGS%
if errorlevel 1 goto err_add

echo.
echo claude mcp list:
call claude mcp list
if errorlevel 1 echo hint: 'claude mcp list' failed; the registration is saved. Check it with: claude mcp get %NAME% 1>&2
echo.
if /i "%SCOPE%"=="project" echo Project-scoped servers show 'Pending approval' until you start 'claude' in this folder and approve them.
echo If '%NAME%' is not Connected, test the server by hand:  "%CMD%" %CMD_SCRIPT% %CONFIG_ARGS% --search test
exit /b 0

rem ---- messages ----------------------------------------------------------------------------------------------
:help
echo Register the second-brain MCP server (mcp_server.py, stdio) with Claude Code via "claude mcp add".
echo.
echo Usage: %SELF% [PYTHON] [--config PATH] [--scope local/user/project]
echo.
echo   PYTHON          interpreter that runs the server (default: .venv\Scripts\python.exe beside this script
echo                   if it exists, else python, else python3 on PATH)
echo   --config PATH   config file the server reads (default: KB_CONFIG, else config.yaml beside the scripts,
echo                   created from config.example.yaml on first run)
echo   --scope SCOPE   user (default: every project), local (only the current folder, private to you) or
echo                   project (writes .mcp.json in the current folder, to share with the team)
echo.
echo The server name is read through kb_config (server.name / KB_SERVER_NAME), so it matches what the server
echo reports. Re-running replaces an existing registration of that name in that scope. Without the claude CLI
echo it prints a JSON snippet for Claude Desktop, Cursor and other MCP clients instead, and exits 0.
echo.
echo Exit codes: 0 registered (or snippet printed), 1 python or "claude mcp add" failed, 2 usage error.
exit /b 0

:err_unknown
echo error: unknown option '%ARG%' 1>&2
goto usage_hint
:err_two_pythons
echo error: only one PYTHON may be given (got '%PY%' and '%ARG%') 1>&2
goto usage_hint
:err_config_arg
echo error: --config needs a path 1>&2
goto usage_hint
:err_scope
echo error: --scope must be local, user or project (got '%SCOPE%') 1>&2
goto usage_hint
:err_config_missing
echo error: config file '%CONFIG%' does not exist; pass an existing file or omit --config 1>&2
goto usage_hint
:usage_hint
echo run '%SELF% --help' for usage 1>&2
exit /b 2

:err_python
del "%OUT%" >nul 2>&1
echo error: cannot run python '%PY%'; pass a working interpreter, e.g. %SELF% C:\path\to\venv\Scripts\python.exe 1>&2
exit /b 1

:err_add
echo error: 'claude mcp add' failed (see above); nothing was registered 1>&2
exit /b 1

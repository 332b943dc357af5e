"""A deterministic synthetic vault for benchmarks: notes of realistic size spread, headings, lists, code, Chinese
and English, frontmatter with tags. Same seed, same bytes. Standard library only.

Usage: python eval/synthetic_vault.py N_NOTES OUT_DIR
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

# Seed of every random choice: runs are comparable.
SEED = 20240611

EN_WORDS = """backup restore server client network connection timeout retry proxy firewall port socket certificate
password key login account user group permission file folder directory path disk space partition mount volume
archive compress extract tarball zip log error warning crash bug fix patch release version branch commit merge rebase
remote clone push pull deploy build test pipeline container image registry cluster node pod service database table
index query schema migration cache memory cpu process thread queue job schedule cron timer script shell terminal
editor config setting option flag environment variable package dependency library module install upgrade python
rust javascript docker kubernetes linux windows macos ssh git nginx postgres redis sqlite api endpoint request response
latency throughput benchmark profile monitor alert dashboard metric report meeting agenda decision action owner
deadline plan roadmap goal idea draft review feedback note summary reading book chapter article paper lesson habit
health running sleep budget travel recipe family weekend project team customer vendor contract invoice""".split()
EN_FILLER = """the a an of to in for on with by from and or but when then after before while because so that this
it we you they is are was be can should will must may need use check make keep run""".split()
ZH_WORDS = """网络 连接 失败 超时 重试 代理 防火墙 端口 证书 密码 密钥 登录 账号 用户 权限 文件 目录 路径 磁盘 空间 分区
挂载 压缩 解压 归档 日志 错误 警告 崩溃 问题 修复 补丁 版本 分支 提交 合并 远程 克隆 推送 部署 构建 测试 流水线 容器
镜像 集群 节点 服务 数据库 表格 索引 查询 迁移 缓存 内存 进程 线程 队列 任务 定时 脚本 终端 编辑器 配置 设置 选项
环境 变量 依赖 安装 升级 接口 请求 响应 延迟 性能 监控 告警 报告 会议 议程 决定 负责人 截止 计划 目标 想法 草稿 评审
反馈 笔记 总结 阅读 书籍 章节 文章 论文 学习 习惯 健康 跑步 睡眠 预算 旅行 菜谱 家庭 周末 项目 团队 客户 供应商 合同
发票 服务器 备份 恢复 系统 命令 工具 方法 步骤 原因 结果 经验""".split()
ZH_FILLER = "的 了 是 在 和 需要 可以 如果 然后 因为 所以 我们 这个 已经 应该 通过 使用 检查 发现 记录".split()
CODE_SNIPPETS = (
    ("bash", "ls -la ~/notes\ndu -sh * | sort -h\nfind . -name '*.md' -size +100k"),
    ("bash", "tar -czvf backup-$(date +%F).tar.gz ~/notes\nrsync -av --delete ~/notes/ /mnt/backup/notes/"),
    ("bash", "git reset --soft HEAD~1\ngit log --oneline -5\ngit push --force-with-lease"),
    ("bash", "ping -c 4 example.com\ncurl -v https://example.com\nss -tlnp | grep 8080"),
    ("bash", "docker ps -a\ndocker logs -f --tail 100 web\ndocker compose up -d"),
    (
        "python",
        "import json\nfrom pathlib import Path\n\ndata = json.loads(Path('config.json').read_text())\nprint(data['port'])",
    ),
    ("python", "python -m venv .venv\nsource .venv/bin/activate\npip install -r requirements.txt"),
    ("bash", "crontab -e\n0 3 * * * /usr/local/bin/backup.sh >> /var/log/backup.log 2>&1"),
    ("sql", "SELECT id, name FROM users WHERE created_at > now() - interval '7 days' ORDER BY id;"),
    ("bash", "chmod 600 ~/.ssh/id_ed25519\nssh -i ~/.ssh/id_ed25519 user@host\nsudo chown -R me:me /srv/app"),
)
TAGS = (
    "linux",
    "git",
    "network",
    "backup",
    "python",
    "docker",
    "work",
    "reading",
    "health",
    "meeting",
    "项目",
    "学习",
    "工具",
    "日记",
    "database",
    "security",
)
FOLDERS = ("projects", "daily", "reference", "howto", "work/meetings", "读书笔记", "inbox", "")


def _en_sentence(rng: random.Random) -> tuple[str, int]:
    n = rng.randint(7, 18)
    words = [rng.choice(EN_WORDS) if rng.random() < 0.55 else rng.choice(EN_FILLER) for _ in range(n)]
    return " ".join(words).capitalize() + rng.choice((".", ".", ".", "?", "!")), n


def _zh_sentence(rng: random.Random) -> tuple[str, int]:
    n = rng.randint(6, 14)
    words = [rng.choice(ZH_WORDS) if rng.random() < 0.65 else rng.choice(ZH_FILLER) for _ in range(n)]
    cut = rng.randint(2, n - 2)
    return "".join(words[:cut]) + "，" + "".join(words[cut:]) + rng.choice(("。", "。", "？", "！")), n


def _paragraph(rng: random.Random, zh_share: float) -> tuple[str, int]:
    make = _zh_sentence if rng.random() < zh_share else _en_sentence
    parts = [make(rng) for _ in range(rng.randint(2, 6))]
    return ("" if make is _zh_sentence else " ").join(p for p, _ in parts), sum(n for _, n in parts)


def _block(rng: random.Random, zh_share: float) -> tuple[str, int]:
    r = rng.random()
    if r < 0.2:
        items = [(_zh_sentence if rng.random() < zh_share else _en_sentence)(rng) for _ in range(rng.randint(3, 7))]
        return "\n".join(f"- {t}" for t, _ in items), sum(n for _, n in items)
    if r < 0.3:
        lang, code = rng.choice(CODE_SNIPPETS)
        return f"```{lang}\n{code}\n```", len(code.split())
    return _paragraph(rng, zh_share)


def render_synthetic_note(rng: random.Random, index: int) -> tuple[str, str]:
    """One note (vault-relative path, Markdown): frontmatter with tags, headings, lists, code, Chinese and English."""
    zh_share = rng.choice((0.0, 0.1, 0.5, 0.5, 0.9, 1.0))
    words_target = rng.randint(2000, 5000) if rng.random() < 0.08 else rng.randint(100, 800)
    if zh_share >= 0.5:
        title = "".join(rng.sample(ZH_WORDS, 2)) + rng.choice(("笔记", "记录", "总结", "方案", "问题"))
    else:
        title = " ".join(rng.sample(EN_WORDS, 3)).title()
    tags = rng.sample(TAGS, rng.randint(1, 3))
    day = f"2023-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    lines = ["---", f"title: {title}", f"tags: [{', '.join(tags)}]", f"created: {day}", "---", "", f"# {title}", ""]
    words = 0
    while words < words_target:
        heading, _ = (_zh_sentence if rng.random() < zh_share else _en_sentence)(rng)
        lines += [f"{'###' if rng.random() < 0.3 else '##'} {heading[:40].rstrip('，。？！.?! ')}", ""]
        for _ in range(rng.randint(1, 4)):
            text, n = _block(rng, zh_share)
            lines += [text, ""]
            words += n
    folder = rng.choice(FOLDERS)
    slug = "-".join(rng.sample(EN_WORDS, 2))
    rel = f"{folder}/{index:05d}-{slug}.md" if folder else f"{index:05d}-{slug}.md"
    return rel, "\n".join(lines)


def write_synthetic_vault(root: Path, n_notes: int, seed: int = SEED) -> None:
    """Write n_notes deterministic notes under root (same seed -> same bytes)."""
    rng = random.Random(seed)
    for i in range(n_notes):
        rel, text = render_synthetic_note(rng, i)
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[1].isdigit():
        sys.exit("usage: python eval/synthetic_vault.py N_NOTES OUT_DIR")
    write_synthetic_vault(Path(sys.argv[2]), int(sys.argv[1]))

//! Which shape of `message.content` a chat template expects: a string, or the OpenAI list of
//! parts (`[{"type": "text", "text": …}, …]`). A template written for strings prints a list as
//! its Python repr, and one written for parts iterates over a string's characters, so the
//! messages are reshaped to the template's format before rendering.
//!
//! The answer comes from the template's syntax tree, the way vLLM and SGLang decide it: the
//! template is "openai" when it loops over a message's content. Names are followed through
//! `set` (`{% set loop_messages = messages[1:] %}`, `{% set content = message['content'] %}`),
//! filters (`messages|selectattr(…)`, `message.content|default([])`), conditional expressions and
//! macro parameters (`{% macro render(content) %}{% for part in content %}…` called as
//! `render(message.content)`). Names are not scoped: a name bound to content anywhere counts
//! everywhere, which errs towards "openai" for a template that reuses a name.

use std::collections::{HashMap, HashSet};

use minijinja::machinery::ast::{CallArg, Expr, Stmt};
use minijinja::machinery::parse;
use minijinja::syntax::SyntaxConfig;

/// The shape of `message.content` a template expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContentFormat {
    /// A string: text parts are joined (with a space, as SGLang and SMG do) before rendering.
    #[default]
    String,
    /// The OpenAI list of parts, passed as the client sent it.
    OpenAi,
}

impl ContentFormat {
    /// The name SGLang and vLLM print for it (`"string"`, `"openai"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::OpenAi => "openai",
        }
    }
}

/// Detects the content format of a template's source; a template that does not parse is
/// "string" (it fails to compile anyway, with its own error).
pub(crate) fn detect(source: &str) -> ContentFormat {
    let Ok(ast) = parse(source, "chat_template", SyntaxConfig::default()) else {
        return ContentFormat::String;
    };
    let mut facts = Facts::default();
    facts.stmt(&ast);
    if facts.loops_over_content() {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

/// Everything the detector needs from a template, collected in one walk.
#[derive(Default)]
struct Facts<'a> {
    /// `{% set name = expr %}` and `{% with name = expr %}`.
    sets: Vec<(&'a str, &'a Expr<'a>)>,
    /// `{% for target in iter %}` with a plain name as target.
    loops: Vec<(Option<&'a str>, &'a Expr<'a>)>,
    /// Macro name → parameter names.
    macros: HashMap<&'a str, Vec<&'a str>>,
    /// Calls of plain names: (callee, arguments).
    calls: Vec<(&'a str, &'a [CallArg<'a>])>,
}

/// Names known to stand for the message list, a message, or a message's content.
#[derive(Default)]
struct Names<'a> {
    messages: HashSet<&'a str>,
    message: HashSet<&'a str>,
    content: HashSet<&'a str>,
}

impl<'a> Names<'a> {
    fn is_messages(&self, e: &Expr<'a>) -> bool {
        match e {
            Expr::Var(v) => self.messages.contains(v.id),
            Expr::Slice(s) => self.is_messages(&s.expr),
            Expr::Filter(f) => f.expr.as_ref().is_some_and(|x| self.is_messages(x)),
            Expr::IfExpr(i) => {
                self.is_messages(&i.true_expr)
                    || i.false_expr.as_ref().is_some_and(|x| self.is_messages(x))
            }
            _ => false,
        }
    }

    fn is_message(&self, e: &Expr<'a>) -> bool {
        match e {
            Expr::Var(v) => self.message.contains(v.id),
            Expr::GetItem(g) => {
                self.is_messages(&g.expr)
                    && !matches!(&g.subscript_expr, Expr::Const(c) if c.value.as_str().is_some())
            }
            _ => false,
        }
    }

    fn is_content(&self, e: &Expr<'a>) -> bool {
        match e {
            Expr::Var(v) => self.content.contains(v.id),
            Expr::GetAttr(g) => g.name == "content" && self.is_message(&g.expr),
            Expr::GetItem(g) => {
                matches!(&g.subscript_expr, Expr::Const(c) if c.value.as_str() == Some("content"))
                    && self.is_message(&g.expr)
            }
            Expr::Filter(f) => f.expr.as_ref().is_some_and(|x| self.is_content(x)),
            Expr::IfExpr(i) => {
                self.is_content(&i.true_expr)
                    || i.false_expr.as_ref().is_some_and(|x| self.is_content(x))
            }
            _ => false,
        }
    }
}

impl<'a> Facts<'a> {
    fn loops_over_content(&self) -> bool {
        let mut names = Names::default();
        names.messages.insert("messages");
        // Each pass can only add names; a template has few, so this settles in a few passes.
        loop {
            let before = names.messages.len() + names.message.len() + names.content.len();
            for &(name, expr) in &self.sets {
                if names.is_messages(expr) {
                    names.messages.insert(name);
                }
                if names.is_message(expr) {
                    names.message.insert(name);
                }
                if names.is_content(expr) {
                    names.content.insert(name);
                }
            }
            for &(target, iter) in &self.loops {
                if let Some(target) = target {
                    if names.is_messages(iter) {
                        names.message.insert(target);
                    }
                }
            }
            for &(callee, args) in &self.calls {
                let Some(params) = self.macros.get(callee) else {
                    continue;
                };
                for (i, arg) in args.iter().enumerate() {
                    let (param, expr) = match arg {
                        CallArg::Pos(e) => (params.get(i).copied(), e),
                        CallArg::Kwarg(name, e) => (Some(*name), e),
                        CallArg::PosSplat(_) | CallArg::KwargSplat(_) => continue,
                    };
                    if let Some(param) = param {
                        if names.is_content(expr) {
                            names.content.insert(param);
                        }
                        if names.is_message(expr) {
                            names.message.insert(param);
                        }
                        if names.is_messages(expr) {
                            names.messages.insert(param);
                        }
                    }
                }
            }
            let after = names.messages.len() + names.message.len() + names.content.len();
            if after == before {
                break;
            }
        }
        self.loops.iter().any(|&(_, iter)| names.is_content(iter))
    }

    fn stmts(&mut self, stmts: &'a [Stmt<'a>]) {
        for s in stmts {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, stmt: &'a Stmt<'a>) {
        match stmt {
            Stmt::Template(t) => self.stmts(&t.children),
            Stmt::EmitExpr(e) => self.expr(&e.expr),
            Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => {}
            Stmt::ForLoop(f) => {
                let target = match &f.target {
                    Expr::Var(v) => Some(v.id),
                    _ => None,
                };
                self.loops.push((target, &f.iter));
                self.expr(&f.iter);
                if let Some(e) = &f.filter_expr {
                    self.expr(e);
                }
                self.stmts(&f.body);
                self.stmts(&f.else_body);
            }
            Stmt::IfCond(i) => {
                self.expr(&i.expr);
                self.stmts(&i.true_body);
                self.stmts(&i.false_body);
            }
            Stmt::WithBlock(w) => {
                for (target, value) in &w.assignments {
                    if let Expr::Var(v) = target {
                        self.sets.push((v.id, value));
                    }
                    self.expr(value);
                }
                self.stmts(&w.body);
            }
            Stmt::Set(s) => {
                if let Expr::Var(v) = &s.target {
                    self.sets.push((v.id, &s.expr));
                }
                self.expr(&s.expr);
            }
            Stmt::SetBlock(s) => self.stmts(&s.body),
            Stmt::AutoEscape(a) => self.stmts(&a.body),
            Stmt::FilterBlock(f) => self.stmts(&f.body),
            Stmt::Block(b) => self.stmts(&b.body),
            Stmt::Import(_) | Stmt::FromImport(_) | Stmt::Extends(_) | Stmt::Include(_) => {}
            Stmt::Macro(m) => {
                let params = m
                    .args
                    .iter()
                    .filter_map(|a| match a {
                        Expr::Var(v) => Some(v.id),
                        _ => None,
                    })
                    .collect();
                self.macros.insert(m.name, params);
                self.stmts(&m.body);
            }
            Stmt::CallBlock(c) => {
                self.call(&c.call.expr, &c.call.args);
                self.stmts(&c.macro_decl.body);
            }
            Stmt::Do(d) => self.call(&d.call.expr, &d.call.args),
        }
    }

    fn call(&mut self, callee: &'a Expr<'a>, args: &'a [CallArg<'a>]) {
        if let Expr::Var(v) = callee {
            self.calls.push((v.id, args));
        }
        self.expr(callee);
        for arg in args {
            match arg {
                CallArg::Pos(e)
                | CallArg::Kwarg(_, e)
                | CallArg::PosSplat(e)
                | CallArg::KwargSplat(e) => self.expr(e),
            }
        }
    }

    /// Walks an expression only to find macro calls inside it.
    fn expr(&mut self, expr: &'a Expr<'a>) {
        match expr {
            Expr::Var(_) | Expr::Const(_) => {}
            Expr::Slice(s) => {
                self.expr(&s.expr);
                for e in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                    self.expr(e);
                }
            }
            Expr::UnaryOp(u) => self.expr(&u.expr),
            Expr::BinOp(b) => {
                self.expr(&b.left);
                self.expr(&b.right);
            }
            Expr::Compare(c) => {
                self.expr(&c.expr);
                for op in &c.ops {
                    self.expr(&op.expr);
                }
            }
            Expr::IfExpr(i) => {
                self.expr(&i.test_expr);
                self.expr(&i.true_expr);
                if let Some(e) = &i.false_expr {
                    self.expr(e);
                }
            }
            Expr::Filter(f) => {
                if let Some(e) = &f.expr {
                    self.expr(e);
                }
                for a in &f.args {
                    self.call_arg(a);
                }
            }
            Expr::Test(t) => {
                self.expr(&t.expr);
                for a in &t.args {
                    self.call_arg(a);
                }
            }
            Expr::GetAttr(g) => self.expr(&g.expr),
            Expr::GetItem(g) => {
                self.expr(&g.expr);
                self.expr(&g.subscript_expr);
            }
            Expr::Call(c) => self.call(&c.expr, &c.args),
            Expr::List(l) => l.items.iter().for_each(|e| self.expr(e)),
            Expr::Tuple(t) => t.items.iter().for_each(|e| self.expr(e)),
            Expr::Map(m) => m.keys.iter().chain(&m.values).for_each(|e| self.expr(e)),
        }
    }

    fn call_arg(&mut self, arg: &'a CallArg<'a>) {
        match arg {
            CallArg::Pos(e)
            | CallArg::Kwarg(_, e)
            | CallArg::PosSplat(e)
            | CallArg::KwargSplat(e) => self.expr(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{detect, ContentFormat::*};

    #[test]
    fn string_templates() {
        for t in [
            "{% for message in messages %}{{ message['content'] }}{% endfor %}",
            "{% for m in messages %}{{ m.content|trim }}{% if m.content|length > 0 %}x{% endif %}{% endfor %}",
            // A loop over something else that happens to be called content.
            "{% for message in messages %}{% for t in tools %}{{ t }}{% endfor %}{{ message.content }}{% endfor %}",
            "{{ messages[0]['content'] }}",
            "{% if %}broken",
        ] {
            assert_eq!(detect(t), String, "{t}");
        }
    }

    #[test]
    fn openai_templates() {
        for t in [
            "{% for message in messages %}{% for part in message['content'] %}{{ part.text }}{% endfor %}{% endfor %}",
            "{% for message in messages %}{% if message.content is string %}{{ message.content }}{% else %}{% for p in message.content %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}",
            "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% set content = m['content'] %}{% for c in content %}{{ c }}{% endfor %}{% endfor %}",
            "{% for m in messages|selectattr('role', 'ne', 'tool') %}{% for c in m.content|default([]) %}{{ c }}{% endfor %}{% endfor %}",
            "{% macro render(content) %}{% if content is string %}{{ content }}{% else %}{% for item in content %}{{ item.text }}{% endfor %}{% endif %}{% endmacro %}{% for message in messages %}{{ render(message.content) }}{% endfor %}",
            "{% set system = messages[0] %}{% for p in system.content %}{{ p }}{% endfor %}",
            "{% for p in messages[0]['content'] %}{{ p }}{% endfor %}",
        ] {
            assert_eq!(detect(t), OpenAi, "{t}");
        }
    }
}
